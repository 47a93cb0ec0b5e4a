/*
 * verdict.c - the verdict's core: the journal's records replayed per message, folded into one
 * row per task type.  See verdict.h; the command and its output are in verdict_print.c.
 *
 * verdict_add_record() runs in journal order and keeps, per message id, the state the app's
 * retries need (which delivery starts an attempt), and a list of compact events (deliveries,
 * settlements, running reports) threaded through one array.  verdict_compute() replays each
 * message's list: settlements matched to deliveries, connection closes (one sorted array of
 * CLOSE records), which deliveries reached a handler, which later ones were copies and how
 * each copy stood to the earlier ones.  Memory: a small struct per message id and 32 bytes per
 * delivery, settlement or report, so a million messages take a few hundred megabytes at most.
 */
#include "offline/verdict.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offline/strmap.h"
#include "offline/verdict_runs.h"
#include "rules/rule.h"

/* verdict_msg.task before any record named one. */
#define VERDICT_NO_TASK UINT32_MAX
/* End of an event list. */
#define VD_NONE UINT32_MAX
/* Listener index of a record whose listener the verdict could not intern (out of range). */
#define VD_LISTENERS_MAX 255u

/* What a message's last DELIVER record was to the attempts, until a fault may withhold it:
 * the first delivery of an attempt (the message's first, or one after a retry the app asked
 * for), or a later one. */
enum verdict_last { LAST_NONE, LAST_FIRST, LAST_LATER };

enum vd_kind { VD_DELIVER = 1, VD_SETTLE = 2, VD_RUNNING = 3 };

/* vd_ev.flags */
#define VD_WITHHELD 1u /* DELIVER: a fault kept it from the worker */
#define VD_NACK 2u     /* SETTLE: a NACK record */
#define VD_REFUSED 4u  /* SETTLE: the framework refused it (journal.proto) */
#define VD_AUTO_ACK 8u /* DELIVER: taken without an ack (journal.proto) */

/* One delivery, settlement or running report of a message, in journal order. */
struct vd_ev {
    uint64_t t;
    uint64_t aux;     /* DELIVER: listener index | attempt << 8 (the attempt it belongs to,
                         1-based); RUNNING: started_unix_us */
    uint32_t session; /* the connection's id (its low 32 bits) */
    uint32_t key;     /* DELIVER, SETTLE: the delivery tag's low 32 bits; RUNNING: run hash */
    uint32_t next;    /* the message's next event, or VD_NONE */
    uint8_t kind;     /* enum vd_kind */
    uint8_t flags;
};

struct verdict_msg {
    uint32_t task;                      /* index into verdict.task_names, or VERDICT_NO_TASK */
    uint32_t delivers, faults, effects; /* saturating counts */
    uint32_t attempts;                  /* the first of each attempt: 1 + the app's retries seen */
    uint32_t retries;                   /* the most retries a delivery of the message carried */
    uint32_t pending_retries;   /* retry_pending: the count the retry carries (0: none said) */
    uint32_t first_ev, last_ev; /* its events in verdict.evs */
    uint32_t last_dl;           /* its last DELIVER event, VD_NONE */
    uint64_t progress_us;       /* its last delivery or settlement */
    uint64_t publish_us;        /* its first publish: since when it waits, if never delivered */
    bool in_journal;
    bool has_first;     /* an attempt has started */
    bool retry_pending; /* the app asked for a new attempt: its next delivery starts it */
    bool failed;        /* its last settlement failed it for good (a NACK without retry) */
    bool abandoned;     /* an ACK came after such a NACK, no delivery between */
    bool published;     /* a PUBLISH record names it */
    bool waiting;       /* at this point of the journal it waits for a delivery: published, or
                           requeued by its consumer (a copy a fault makes due is not counted:
                           another settlement may have cleared it, as kombu's shared tag does) */
    uint8_t last;       /* enum verdict_last */
};

/* A delivery's time out on its connection: from its delivery to its settlement (or to its
 * connection's close, or for ever); maxend: the latest end of it and the connection's earlier
 * spans. */
struct vd_span {
    uint32_t session;
    uint32_t ev; /* its DELIVER event (verdict.evs): tells it from another of the same time */
    uint64_t t, end, maxend;
};

/* A CLOSE record: the connection's id and when. */
struct vd_close {
    uint32_t session;
    uint64_t t;
};

/* A listener as the header (and the records) name it. */
struct vd_listener {
    const char *name;         /* borrowed from verdict.listener_ids */
    char *protocol, *profile; /* owned; NULL: not in the header */
    uint32_t visibility_ms;   /* amqp: its visibility or consumer timeout (0: none, or unsaid) */
    bool consumer_timeout;    /* ... a consumer-timeout */
    bool settles_by_header;   /* its framework settles deliveries on the wire */
    bool settle_seen;         /* an ACK or NACK came through it */
};

struct verdict {
    struct vd_ev *evs;
    uint32_t n_evs, cap_evs;
    struct vd_close *closes;
    size_t n_closes, cap_closes;
    bool closes_sorted;
    /* Every live delivery's span on its connection, by connection and time (vd_index_build()):
     * whether a worker still had an earlier delivery out when another came.  Built on first
     * need, after the records. */
    struct vd_span *spans;
    size_t n_spans;
    bool spans_built;
    struct strmap msgs;      /* message id -> struct verdict_msg * (owned) */
    struct strmap tasks;     /* task name -> index + 1, as a pointer */
    const char **task_names; /* owned array; names borrowed from `tasks` */
    size_t n_tasks, cap_tasks;
    struct strmap listener_ids; /* listener name -> index + 1 */
    struct vd_listener listeners[VD_LISTENERS_MAX];
    size_t n_listeners;
    uint64_t end_us;
    uint64_t comma_lines;
    /* The twice runs of the journals, one per header (`journal PATH append` adds a run after
     * the others; several journals are read together), and their connections, each keyed
     * apart (verdict_runs.h): a record's session is its key there. */
    struct vd_runs runs;
};

static void sat_inc(uint32_t *n)
{
    if (*n < UINT32_MAX)
        (*n)++;
}

const char *verdict_kind_name(enum verdict_kind k)
{
    switch (k) {
    case VERDICT_IDEMPOTENT:
        return "IDEMPOTENT";
    case VERDICT_NOT_IDEMPOTENT:
        return "NOT IDEMPOTENT";
    case VERDICT_UNTESTED:
    default:
        return "UNTESTED";
    }
}

const char *verdict_overlap_name(enum verdict_overlap o)
{
    switch (o) {
    case VERDICT_COPY_AFTER:
        return "after";
    case VERDICT_COPY_OVERLAP:
        return "overlap";
    case VERDICT_COPY_UNKNOWN:
        return "unknown";
    case VERDICT_COPY_NONE:
    default:
        return "";
    }
}

struct verdict *verdict_new(void)
{
    return calloc(1, sizeof(struct verdict));
}

void verdict_free(struct verdict *v)
{
    if (v == NULL)
        return;
    strmap_free(&v->msgs, free);
    strmap_free(&v->tasks, NULL);
    strmap_free(&v->listener_ids, NULL);
    for (size_t i = 0; i < v->n_listeners; i++) {
        free(v->listeners[i].protocol);
        free(v->listeners[i].profile);
    }
    free(v->evs);
    vd_runs_free(&v->runs);
    free(v->closes);
    free(v->spans);
    free(v->task_names);
    free(v);
}

/* ---- interning ------------------------------------------------------------------------- */

/* The index of task name, adding it when new.  -1 when out of memory. */
static int task_index(struct verdict *v, const char *name, uint32_t *idx)
{
    bool inserted = false;
    void **slot = strmap_put(&v->tasks, name, &inserted);
    if (slot == NULL)
        return -1;
    if (!inserted && *slot != NULL) {
        *idx = (uint32_t)((uintptr_t)*slot - 1);
        return 0;
    }
    if (v->n_tasks == v->cap_tasks) {
        size_t cap = v->cap_tasks != 0 ? v->cap_tasks * 2 : 16;
        const char **names = realloc(v->task_names, cap * sizeof(*names));
        if (names == NULL)
            return -1; /* the name stays in the map with a NULL value: retried */
        v->task_names = names;
        v->cap_tasks = cap;
    }
    v->task_names[v->n_tasks] = strmap_key(&v->tasks, name);
    *slot = (void *)(uintptr_t)(v->n_tasks + 1);
    *idx = (uint32_t)v->n_tasks++;
    return 0;
}

/* The index of listener name (NULL as ""), adding it when new; VD_LISTENERS_MAX past the
 * table.  -1 when out of memory. */
static int listener_index(struct verdict *v, const char *name, uint32_t *idx)
{
    bool inserted = false;
    void **slot = strmap_put(&v->listener_ids, name != NULL ? name : "", &inserted);
    if (slot == NULL)
        return -1;
    if (*slot != NULL) {
        *idx = (uint32_t)((uintptr_t)*slot - 1);
        return 0;
    }
    if (v->n_listeners == VD_LISTENERS_MAX) {
        *idx = VD_LISTENERS_MAX;
        return 0; /* left unset: looked up again, still past the table */
    }
    v->listeners[v->n_listeners].name = strmap_key(&v->listener_ids, name != NULL ? name : "");
    *slot = (void *)(uintptr_t)(v->n_listeners + 1);
    *idx = (uint32_t)v->n_listeners++;
    return 0;
}

/* Whether deliveries of a protocol/profile are settled on the wire: AMQP's acks, kombu's
 * unacked transaction, RQ's finish, XACK, BullMQ's moveToFinished.  Sidekiq never settles, and
 * a list app only with a processing list (seen when its acks come). */
static bool settles_by_name(const char *protocol, const char *profile)
{
    if (strcmp(protocol, "amqp") == 0)
        return true;
    if (strcmp(protocol, "resp") != 0)
        return false;
    static const char *const settling[] = {"celery", "rq", "streams", "bullmq"};
    for (size_t i = 0; i < sizeof(settling) / sizeof(settling[0]); i++) {
        if (strcmp(profile, settling[i]) == 0)
            return true;
    }
    return false;
}

/* Appends x to the array *a of *n (room *cap).  -1 when out of memory. */
static int u32_push(uint32_t **a, size_t *n, size_t *cap, uint32_t x)
{
    if (*n == *cap) {
        size_t c = *cap != 0 ? *cap * 2 : 64;
        uint32_t *p = realloc(*a, c * sizeof(*p));
        if (p == NULL)
            return -1;
        *a = p;
        *cap = c;
    }
    (*a)[(*n)++] = x;
    return 0;
}

static void sort_closes(const struct verdict *v);
static uint64_t close_time(const struct verdict *v, uint32_t session);
static int add_close_at(struct verdict *v, uint32_t session, uint64_t t);

/* Twice run `run` ended (another header of its journal follows): each connection it delivered
 * on and did not close closed then, at its last record.  -1 when out of memory. */
static int end_twice_run(struct verdict *v, uint32_t run)
{
    sort_closes(v);
    uint32_t *open = NULL;
    size_t n = 0, cap = 0;
    for (uint32_t k = 1; k < v->runs.n_conns; k++) {
        const struct vd_conn *c = &v->runs.conns[k];
        if (c->run == run && c->delivered && close_time(v, k) == 0 &&
            u32_push(&open, &n, &cap, k) != 0) {
            free(open);
            return -1;
        }
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = add_close_at(v, open[i], v->runs.runs[run].last_us);
    free(open);
    return rc;
}

int verdict_add_header(struct verdict *v, const Twice__Journal__Header *h)
{
    return verdict_add_source_header(v, 0, h, NULL);
}

int verdict_add_source_header(struct verdict *v, uint32_t source, const Twice__Journal__Header *h,
                              const char *fallback_instance)
{
    uint32_t prev = VD_RUN_NONE, run = 0;
    const char *instance = h->instance != NULL && h->instance[0] != '\0' ? h->instance
                           : fallback_instance != NULL                   ? fallback_instance
                                                                         : "-";
    if (vd_runs_begin(&v->runs, source, instance, &prev, &run) != 0)
        return -1;
    if (prev != VD_RUN_NONE && end_twice_run(v, prev) != 0)
        return -1;
    for (size_t i = 0; i < h->n_listeners; i++) {
        const Twice__Journal__Listener *l = h->listeners[i];
        uint32_t idx = 0;
        if (listener_index(v, l->name, &idx) != 0)
            return -1;
        if (idx == VD_LISTENERS_MAX || v->listeners[idx].protocol != NULL)
            continue;
        struct vd_listener *vl = &v->listeners[idx];
        vl->protocol = strdup(l->protocol);
        vl->profile = strdup(l->profile);
        if (vl->protocol == NULL || vl->profile == NULL)
            return -1;
        vl->settles_by_header = settles_by_name(l->protocol, l->profile);
        vl->visibility_ms = l->visibility_timeout_ms;
        vl->consumer_timeout = l->consumer_timeout;
    }
    return 0;
}

/* The counts for id, created zeroed when new.  NULL when out of memory. */
static struct verdict_msg *msg_get(struct verdict *v, const char *id)
{
    bool inserted = false;
    void **slot = strmap_put(&v->msgs, id, &inserted);
    if (slot == NULL)
        return NULL;
    if (*slot == NULL) {
        struct verdict_msg *m = calloc(1, sizeof(*m));
        if (m == NULL)
            return NULL; /* a NULL value is retried on the next call */
        m->task = VERDICT_NO_TASK;
        m->first_ev = m->last_ev = m->last_dl = VD_NONE;
        *slot = m;
    }
    return *slot;
}

/* Appends an event to m's list.  Its index, or VD_NONE when out of memory. */
static uint32_t ev_push(struct verdict *v, struct verdict_msg *m, const struct vd_ev *e)
{
    if (v->n_evs == v->cap_evs) {
        uint32_t cap = v->cap_evs != 0 ? v->cap_evs * 2 : 256;
        if (cap <= v->cap_evs || cap == VD_NONE)
            return VD_NONE;
        struct vd_ev *evs = realloc(v->evs, (size_t)cap * sizeof(*evs));
        if (evs == NULL)
            return VD_NONE;
        v->evs = evs;
        v->cap_evs = cap;
    }
    uint32_t i = v->n_evs++;
    v->evs[i] = *e;
    v->evs[i].next = VD_NONE;
    if (m->last_ev != VD_NONE)
        v->evs[m->last_ev].next = i;
    else
        m->first_ev = i;
    m->last_ev = i;
    return i;
}

/* ---- the records, in journal order ------------------------------------------------------- */

/* A fault on event `ev` that kept the message from going on: drop (the message removed),
 * error (the channel closed instead), close before (the connection cut before it). */
static bool fault_keeps_back(const Twice__Journal__Record *r, enum rule_event ev)
{
    if (r->event != ev)
        return false;
    if (r->action == RULE_ACT_DROP || r->action == RULE_ACT_ERROR)
        return true;
    return r->action == RULE_ACT_CLOSE && r->detail != NULL &&
           strcmp(r->detail, "close before") == 0;
}

/* A DELIVER of m carrying `retries`: the first of an attempt (the message's first, the first
 * after the app asked for a retry, or one whose retry count is above every earlier record's),
 * or a later one of the current attempt. */
static void attempt_note(struct verdict_msg *m, uint32_t retries)
{
    /* A retry that carries its count is started by a delivery of that count: a copy of the
     * earlier attempt that comes first is still a copy. */
    bool attempt = !m->has_first || (m->retry_pending && retries >= m->pending_retries) ||
                   retries > m->retries;
    if (retries > m->retries)
        m->retries = retries;
    if (attempt) {
        m->has_first = true;
        m->retry_pending = false;
        m->last = LAST_FIRST;
        sat_inc(&m->attempts);
    } else {
        m->last = LAST_LATER;
    }
}

/* A fault withheld m's last delivery: it starts no attempt.  A withheld first of a retry
 * leaves the retry to the next delivery. */
static void attempt_withheld(struct verdict *v, struct verdict_msg *m)
{
    if (m->last == LAST_FIRST) {
        if (m->attempts > 0)
            m->attempts--;
        if (m->attempts == 0)
            m->has_first = false;
        else
            m->retry_pending = true;
    }
    if (m->last_dl != VD_NONE)
        v->evs[m->last_dl].flags |= VD_WITHHELD;
    m->last = LAST_NONE;
}

static int add_deliver(struct verdict *v, struct verdict_msg *m, const Twice__Journal__Record *r)
{
    uint32_t li = 0;
    if (listener_index(v, r->listener, &li) != 0)
        return -1;
    sat_inc(&m->delivers);
    attempt_note(m, r->retries);
    struct vd_ev e = {
        .t = r->time_unix_us,
        .aux = li | (uint64_t)m->attempts << 8,
        .session = (uint32_t)r->session,
        .key = (uint32_t)r->delivery_tag,
        .kind = VD_DELIVER,
        .flags = r->auto_ack ? VD_AUTO_ACK : 0,
    };
    m->last_dl = ev_push(v, m, &e);
    if (m->last_dl == VD_NONE)
        return -1;
    /* At the end of its twice run, a connection delivered on and not closed closed with it. */
    if (e.session != 0)
        v->runs.conns[e.session].delivered = true;
    m->waiting = false;
    if (r->time_unix_us > m->progress_us)
        m->progress_us = r->time_unix_us;
    return 0;
}

static int add_settle(struct verdict *v, struct verdict_msg *m, const Twice__Journal__Record *r)
{
    bool nack = r->kind == TWICE__JOURNAL__RECORD__KIND__NACK;
    uint32_t li = 0;
    if (listener_index(v, r->listener, &li) != 0)
        return -1;
    if (li < VD_LISTENERS_MAX)
        v->listeners[li].settle_seen = true;
    struct vd_ev e = {
        .t = r->time_unix_us,
        .aux = li,
        .session = (uint32_t)r->session,
        .key = (uint32_t)r->delivery_tag,
        .kind = VD_SETTLE,
        .flags = (uint8_t)((nack ? VD_NACK : 0) | (r->refused ? VD_REFUSED : 0)),
    };
    if (ev_push(v, m, &e) == VD_NONE)
        return -1;
    if (r->time_unix_us > m->progress_us)
        m->progress_us = r->time_unix_us;
    if (r->refused || r->kept_back)
        return 0; /* the framework did not apply it: the message's state is unchanged */
    if (!nack && m->failed)
        m->abandoned = true;
    if (!nack) {
        m->failed = false; /* settled after all */
    } else if (!r->retry) {
        /* Failed for good; one abandoned before it did not complete after all (RQ's horse
         * failing a reaped job: its ZREM from the started registry, then its ZADD to failed). */
        m->failed = true;
        m->abandoned = false;
    } else {
        m->waiting = true; /* requeued */
    }
    return 0;
}

static int add_running(struct verdict *v, struct verdict_msg *m, const Twice__Journal__Record *r)
{
    /* A run is told apart by who reports it and when it started (a thread that runs the same
     * job again later is another run). */
    uint64_t h = 1469598103934665603ull;
    for (const char *p = r->run != NULL ? r->run : ""; *p != '\0'; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ r->started_unix_us) * 1099511628211ull;
    struct vd_ev e = {
        .t = r->time_unix_us,
        .aux = r->started_unix_us,
        .session = (uint32_t)r->session,
        .key = (uint32_t)(h ^ (h >> 32)),
        .kind = VD_RUNNING,
    };
    return ev_push(v, m, &e) == VD_NONE ? -1 : 0;
}

static int add_fault(struct verdict *v, struct verdict_msg *m, const Twice__Journal__Record *r)
{
    sat_inc(&m->faults);
    /* A delivery is withheld once (its last delivery, not an earlier one): on an amqp
     * listener a `close before` or an `error` ends the actions, yet the rules after it that
     * fired are journaled too (a drop among them). */
    if (fault_keeps_back(r, RULE_EV_DELIVER) && m->last != LAST_NONE)
        attempt_withheld(v, m);
    if (fault_keeps_back(r, RULE_EV_PUBLISH)) {
        /* The retry never reaches the broker (its publish kept back): a delivery after it is
         * twice's doing, not the app's; and nothing waits for a delivery. */
        m->retry_pending = false;
        m->waiting = false;
    }
    return 0;
}

static int add_close(struct verdict *v, const Twice__Journal__Record *r)
{
    return add_close_at(v, (uint32_t)r->session, r->time_unix_us);
}

static int add_close_at(struct verdict *v, uint32_t session, uint64_t t)
{
    if (v->n_closes == v->cap_closes) {
        size_t cap = v->cap_closes != 0 ? v->cap_closes * 2 : 64;
        struct vd_close *c = realloc(v->closes, cap * sizeof(*c));
        if (c == NULL)
            return -1;
        v->closes = c;
        v->cap_closes = cap;
    }
    v->closes[v->n_closes++] = (struct vd_close){session, t};
    v->closes_sorted = false;
    return 0;
}

/* Names m's task from r when it has none yet. */
static int note_task(struct verdict *v, struct verdict_msg *m, const Twice__Journal__Record *r)
{
    if (m->task != VERDICT_NO_TASK || r->task == NULL || r->task[0] == '\0')
        return 0;
    uint32_t idx = 0;
    if (task_index(v, r->task, &idx) != 0)
        return -1;
    m->task = idx;
    return 0;
}

int verdict_add_record(struct verdict *v, const Twice__Journal__Record *r)
{
    return verdict_add_source_record(v, 0, r);
}

int verdict_add_source_record(struct verdict *v, uint32_t source, const Twice__Journal__Record *r)
{
    /* The record's connection keyed apart from every other journal's and run's (a shallow
     * copy: only the session differs). */
    uint32_t run = vd_runs_current(&v->runs, source), key = 0;
    if (vd_runs_key(&v->runs, run, r->session, &key) != 0)
        return -1;
    Twice__Journal__Record keyed = *r;
    keyed.session = key;
    r = &keyed;
    if (run != VD_RUN_NONE && r->time_unix_us > v->runs.runs[run].last_us)
        v->runs.runs[run].last_us = r->time_unix_us;
    v->spans_built = false;
    if (r->time_unix_us > v->end_us)
        v->end_us = r->time_unix_us;
    if (r->kind == TWICE__JOURNAL__RECORD__KIND__CLOSE)
        return add_close(v, r);
    if (r->message_id == NULL || r->message_id[0] == '\0')
        return 0;
    struct verdict_msg *m = msg_get(v, r->message_id);
    if (m == NULL || note_task(v, m, r) != 0)
        return -1;
    m->in_journal = true;
    switch (r->kind) {
    case TWICE__JOURNAL__RECORD__KIND__DELIVER:
        m->failed = false; /* run again */
        return add_deliver(v, m, r);
    case TWICE__JOURNAL__RECORD__KIND__ACK:
    case TWICE__JOURNAL__RECORD__KIND__NACK:
        /* A consumer's requeue asks for the next delivery as a new attempt. */
        if (r->kind == TWICE__JOURNAL__RECORD__KIND__NACK && r->retry && !r->refused &&
            m->has_first) {
            m->retry_pending = true;
            m->pending_retries = r->retries;
        }
        return add_settle(v, m, r);
    case TWICE__JOURNAL__RECORD__KIND__PUBLISH:
        /* The app sent a message it ran before again: the next delivery is an attempt it asked
         * for.  Before the first delivery there is nothing to retry (a message published with
         * a count, its earlier runs not seen). */
        if (r->retry && m->has_first) {
            m->retry_pending = true;
            m->pending_retries = r->retries;
        }
        m->published = true;
        m->waiting = true;
        if (m->publish_us == 0 || r->time_unix_us < m->publish_us)
            m->publish_us = r->time_unix_us;
        return 0;
    case TWICE__JOURNAL__RECORD__KIND__FAULT:
        return add_fault(v, m, r);
    case TWICE__JOURNAL__RECORD__KIND__RUNNING:
        return add_running(v, m, r);
    default:
        return 0;
    }
}

int verdict_add_effect(struct verdict *v, const char *message_id)
{
    struct verdict_msg *m = msg_get(v, message_id);
    if (m == NULL)
        return -1;
    sat_inc(&m->effects);
    return 0;
}

void verdict_note_effect_line_shape(struct verdict *v, const char *line)
{
    if (strpbrk(line, ",;") != NULL)
        v->comma_lines++;
}

/* ---- one message replayed ---------------------------------------------------------------- */

static int close_cmp(const void *a, const void *b)
{
    const struct vd_close *x = a, *y = b;
    if (x->session != y->session)
        return x->session < y->session ? -1 : 1;
    return x->t < y->t ? -1 : x->t > y->t;
}

/* Sorts the CLOSE records for close_time(), once.  No change a caller sees: v stays const as
 * far as what it answers goes. */
static void sort_closes(const struct verdict *v)
{
    struct verdict *mv = (struct verdict *)v;
    if (!mv->closes_sorted && mv->n_closes > 1)
        qsort(mv->closes, mv->n_closes, sizeof(*mv->closes), close_cmp);
    mv->closes_sorted = true;
}

/* When connection `session` closed (its first CLOSE record), or 0.  v->closes sorted. */
static uint64_t close_time(const struct verdict *v, uint32_t session)
{
    size_t lo = 0, hi = v->n_closes;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v->closes[mid].session < session)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < v->n_closes && v->closes[lo].session == session ? v->closes[lo].t : 0;
}

/* Room for one message's replay, reused from message to message. */
struct vd_scratch {
    struct verdict_delivery *d;
    uint8_t *listener; /* per delivery */
    size_t cap;
    struct vd_run *runs;
    size_t n_runs, cap_runs;
    uint32_t report_session; /* the last RUNNING report's connection and time, and its run */
    uint64_t report_t;
    size_t report_run;
    uint64_t last_settle_us; /* the message's last settlement */
};

/* A run of the message as its RUNNING reports show it: running from `from` (it started no
 * later) to `to` (its last report); `beside`: one report listed it with another run of the
 * message (one heartbeat of one process, so one clock: both ran then). */
struct vd_run {
    uint32_t key;
    uint64_t from, to;
    bool beside;
};

static void scratch_free(struct vd_scratch *s)
{
    free(s->d);
    free(s->listener);
    free(s->runs);
}

static int scratch_room(struct vd_scratch *s, size_t n)
{
    if (n < s->cap)
        return 0;
    size_t cap = s->cap != 0 ? s->cap * 2 : 8;
    while (cap <= n)
        cap *= 2;
    struct verdict_delivery *d = realloc(s->d, cap * sizeof(*d));
    if (d == NULL)
        return -1;
    s->d = d;
    uint8_t *l = realloc(s->listener, cap);
    if (l == NULL)
        return -1;
    s->listener = l;
    s->cap = cap;
    return 0;
}

/* Which unsettled, live delivery among d[0..n) a settlement e settles: the one of its
 * connection and delivery tag, else the oldest of its connection, else the oldest whose
 * connection was still open when e came, else the oldest.  -1: none (its delivery came before
 * the journal did).  *guess: chosen among two or more without a connection naming it.  The
 * deliveries before d[lo] are all settled or withheld. */
static long settle_match(const struct verdict *v, const struct verdict_delivery *d, size_t lo,
                         size_t n, const struct vd_ev *e, bool *guess)
{
    long same_conn = -1, open = -1, any = -1;
    size_t candidates = 0;
    for (size_t i = lo; i < n; i++) {
        if (d[i].settled || d[i].withheld)
            continue;
        candidates++;
        if (d[i].session == e->session && e->session != 0) {
            if (e->key != 0 && (uint32_t)d[i].tag == e->key) {
                *guess = false;
                return (long)i;
            }
            if (same_conn < 0)
                same_conn = (long)i;
        }
        uint64_t closed = close_time(v, (uint32_t)d[i].session);
        if (open < 0 && (closed == 0 || closed >= e->t))
            open = (long)i;
        if (any < 0)
            any = (long)i;
    }
    *guess = same_conn < 0 && candidates > 1;
    return same_conn >= 0 ? same_conn : open >= 0 ? open : any;
}

/* Adds a RUNNING report to the message's runs. */
/* The index of e's run among s->runs, added when new.  SIZE_MAX when out of memory. */
static size_t run_of(struct vd_scratch *s, const struct vd_ev *e)
{
    for (size_t i = 0; i < s->n_runs; i++) {
        if (s->runs[i].key == e->key) {
            if (e->t < s->runs[i].from)
                s->runs[i].from = e->t;
            if (e->t > s->runs[i].to)
                s->runs[i].to = e->t;
            return i;
        }
    }
    if (s->n_runs == s->cap_runs) {
        size_t cap = s->cap_runs != 0 ? s->cap_runs * 2 : 4;
        struct vd_run *r = realloc(s->runs, cap * sizeof(*r));
        if (r == NULL)
            return SIZE_MAX;
        s->runs = r;
        s->cap_runs = cap;
    }
    /* It ran from its start at the latest: the start the worker reports, or its first
     * report, whichever is earlier. */
    uint64_t from = e->aux != 0 && e->aux < e->t ? e->aux : e->t;
    s->runs[s->n_runs] = (struct vd_run){e->key, from, e->t, false};
    return s->n_runs++;
}

/* Adds a RUNNING report to the message's runs; two runs in one report (the same connection
 * and time: one heartbeat) ran at once. */
static int run_note(struct vd_scratch *s, const struct vd_ev *e)
{
    size_t i = run_of(s, e);
    if (i == SIZE_MAX)
        return -1;
    if (s->n_runs > 1 && s->report_t == e->t && s->report_session == e->session &&
        s->report_run != i) {
        s->runs[i].beside = true;
        s->runs[s->report_run].beside = true;
    }
    s->report_t = e->t;
    s->report_session = e->session;
    s->report_run = i;
    return 0;
}

/* The message's deliveries, with their settlements and closes, into s->d[0..*n). */
static int replay_events(const struct verdict *v, const struct verdict_msg *m, struct vd_scratch *s,
                         size_t *n)
{
    *n = 0;
    size_t open_from = 0; /* every delivery before it is settled or withheld */
    s->n_runs = 0;
    s->report_t = 0;
    s->last_settle_us = 0;
    for (uint32_t i = m->first_ev; i != VD_NONE; i = v->evs[i].next) {
        const struct vd_ev *e = &v->evs[i];
        if (e->kind == VD_RUNNING) {
            if (run_note(s, e) != 0)
                return -1;
        } else if (e->kind == VD_DELIVER) {
            if (scratch_room(s, *n) != 0)
                return -1;
            s->d[*n] = (struct verdict_delivery){
                .time_us = e->t,
                .session = e->session,
                .tag = e->key,
                .attempt = (uint32_t)(e->aux >> 8),
                .ev = i,
                .withheld = (e->flags & VD_WITHHELD) != 0,
                .auto_ack = (e->flags & VD_AUTO_ACK) != 0,
            };
            s->listener[(*n)++] = (uint8_t)(e->aux & 0xff);
        } else if (e->kind == VD_SETTLE) {
            if (e->t > s->last_settle_us)
                s->last_settle_us = e->t;
            bool guess = false;
            while (open_from < *n && (s->d[open_from].settled || s->d[open_from].withheld))
                open_from++; /* a message delivered again and again stays linear */
            long k = settle_match(v, s->d, open_from, *n, e, &guess);
            if (k >= 0) {
                s->d[k].settled = true;
                s->d[k].settled_guess = guess;
                s->d[k].settled_us = e->t;
                s->d[k].refused = (e->flags & VD_REFUSED) != 0;
                s->d[k].nack = (e->flags & VD_NACK) != 0;
            }
        }
    }
    for (size_t i = 0; i < *n; i++) {
        uint64_t closed = close_time(v, (uint32_t)s->d[i].session);
        if (closed != 0 && (!s->d[i].settled || closed < s->d[i].settled_us))
            s->d[i].closed_us = closed;
    }
    return 0;
}

/* Whether deliveries through listener index li are settled on the wire. */
static bool listener_settles(const struct verdict *v, uint8_t li)
{
    if (li >= v->n_listeners)
        return false;
    return v->listeners[li].settles_by_header || v->listeners[li].settle_seen;
}

/* Whether connection `session` had a delivery out at time `at` that came before delivery `self`
 * of time `before`: its worker was busy with it, so `self` may wait in its buffer.  Spans built
 * (vd_prepare()). */
static bool conn_busy(const struct verdict *v, uint32_t session, uint64_t before, uint32_t self,
                      uint64_t at)
{
    size_t lo = 0, hi = v->n_spans;
    while (lo < hi) { /* the first span past (session, before - 1) */
        size_t mid = lo + (hi - lo) / 2;
        const struct vd_span *p = &v->spans[mid];
        if (p->session < session || (p->session == session && p->t < before))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0 && v->spans[lo - 1].session == session &&
        v->spans[lo - 1].maxend > at + VERDICT_OVERLAP_MARGIN_US)
        return true;
    /* In the same microsecond, the journal's order is the connection's: its records are
     * written by the one thread that serves it, as it reads. */
    for (size_t i = lo; i < v->n_spans && v->spans[i].session == session && v->spans[i].t == before;
         i++)
        if (v->spans[i].ev < self && v->spans[i].end > at + VERDICT_OVERLAP_MARGIN_US)
            return true;
    return false;
}

/* How copy c stood to the earlier delivery e of its attempt, and for an overlap, for how long
 * (at least) both ran.  An overlap is claimed only when both were surely running at c's time:
 * e unsettled then, on another connection still open, with nothing of e's connection before it
 * still out (e was not waiting in its worker's buffer), nor anything of c's (c did not wait). */
static enum verdict_overlap copy_stand(const struct verdict *v, const struct verdict_delivery *e,
                                       const struct verdict_delivery *c, uint64_t *overlap_us)
{
    if (!e->settled)
        return VERDICT_COPY_UNKNOWN;
    if (e->settled_us <= c->time_us + VERDICT_OVERLAP_MARGIN_US)
        return e->settled_guess ? VERDICT_COPY_UNKNOWN /* that end may be c's own */
                                : VERDICT_COPY_AFTER;
    if (e->session == c->session)
        return VERDICT_COPY_UNKNOWN; /* it may have waited behind e in that worker */
    if (e->closed_us != 0 && e->closed_us <= c->time_us)
        return VERDICT_COPY_UNKNOWN; /* e's worker lost that connection first: the copy may
                                        have gone to it, reconnected, and waited behind e */
    if (conn_busy(v, (uint32_t)e->session, e->time_us, e->ev, c->time_us) ||
        conn_busy(v, (uint32_t)c->session, c->time_us, c->ev, c->time_us))
        return VERDICT_COPY_UNKNOWN; /* one of them may still have waited in a buffer */
    *overlap_us = e->settled_us - c->time_us;
    return VERDICT_COPY_OVERLAP;
}

/* How copy d[i] stood to the earlier reached deliveries of its attempt, linked from `from`
 * through next[] (indices, SIZE_MAX ends). */
static void copy_classify(const struct verdict *v, struct verdict_delivery *d, size_t i,
                          size_t from, const size_t *next)
{
    enum verdict_overlap st = VERDICT_COPY_AFTER;
    for (size_t j = from; j != SIZE_MAX; j = next[j]) {
        uint64_t us = 0;
        enum verdict_overlap o = copy_stand(v, &d[j], &d[i], &us);
        if (o == VERDICT_COPY_OVERLAP && (st != VERDICT_COPY_OVERLAP || us > d[i].overlap_us))
            d[i].overlap_us = us;
        if (o == VERDICT_COPY_OVERLAP || (o == VERDICT_COPY_UNKNOWN && st == VERDICT_COPY_AFTER))
            st = o;
    }
    d[i].overlap = st;
    uint64_t t0 = d[from].time_us;
    d[i].copy_delay_us = d[i].time_us > t0 ? d[i].time_us - t0 : 0;
}

/* Per attempt of a message, while its deliveries are classified: whether one was live yet,
 * and its reached deliveries as a list (first, last) through vd_classify.next. */
struct vd_attempt {
    bool live;
    size_t first, last; /* SIZE_MAX: none reached yet */
};

/* Marks each live delivery of s->d[0..n) as its attempt's first, a copy, or set aside, in one
 * pass: attempts are the message's own (1 to n).  -1 when out of memory. */
static int classify_all(const struct verdict *v, struct vd_scratch *s, size_t n)
{
    uint32_t top = 0;
    for (size_t i = 0; i < n; i++)
        if (s->d[i].attempt > top)
            top = s->d[i].attempt;
    struct vd_attempt *at = malloc(((size_t)top + 1) * sizeof(*at));
    size_t *next = malloc((n != 0 ? n : 1) * sizeof(*next));
    if (at == NULL || next == NULL) {
        free(at);
        free(next);
        return -1;
    }
    for (uint32_t a = 0; a <= top; a++)
        at[a] = (struct vd_attempt){false, SIZE_MAX, SIZE_MAX};
    struct verdict_delivery *d = s->d;
    for (size_t i = 0; i < n; i++) {
        if (d[i].withheld)
            continue;
        struct vd_attempt *a = &at[d[i].attempt];
        d[i].reached = d[i].settled || d[i].auto_ack || !listener_settles(v, s->listener[i]);
        bool first = !a->live;
        a->live = true;
        next[i] = SIZE_MAX;
        if (!first && (!d[i].reached || a->first == SIZE_MAX))
            d[i].set_aside = true; /* no worker was seen to finish it, or the one before it */
        else if (!first)
            copy_classify(v, d, i, a->first, next);
        if (!d[i].reached)
            continue;
        if (a->first == SIZE_MAX)
            a->first = i;
        else
            next[a->last] = i;
        a->last = i;
    }
    free(at);
    free(next);
    return 0;
}

/* A run the reports show going on after copy c came, that had started before it: c reached a
 * worker while an earlier run of the message still ran (the end of that run, at least, is
 * known).  Its time beside c, or 0 when there is none. */
static uint64_t run_beside(const struct vd_scratch *s, const struct verdict_delivery *c)
{
    uint64_t best = 0;
    for (size_t r = 0; r < s->n_runs; r++) {
        const struct vd_run *R = &s->runs[r];
        /* A start the worker reports is by its clock, the copy's delivery by twice's: the
         * run must have started more than VERDICT_RUN_CLOCK_US before the copy came to be
         * surely another's. */
        if (R->from + VERDICT_RUN_CLOCK_US < c->time_us &&
            R->to > c->time_us + VERDICT_OVERLAP_MARGIN_US && R->to - c->time_us > best)
            best = R->to - c->time_us;
    }
    return best;
}

/* Copies the reports show beside another run of the message in one heartbeat: one less than
 * the runs so seen (a lower bound when several groups were). */
static size_t runs_together(const struct vd_scratch *s)
{
    size_t k = 0;
    for (size_t r = 0; r < s->n_runs; r++)
        k += s->runs[r].beside;
    return k > 1 ? k - 1 : 0;
}

/* Where the settlements leave a copy's standing unknown (Sidekiq settles nothing on the wire),
 * the running reports may prove the overlap: an earlier run seen going on after the copy came,
 * or two runs seen at once (each such run one copy). */
static void runs_upgrade(struct vd_scratch *s, size_t n)
{
    size_t together = runs_together(s);
    for (size_t i = 0; i < n; i++) {
        struct verdict_delivery *d = &s->d[i];
        if (d->overlap != VERDICT_COPY_UNKNOWN)
            continue;
        uint64_t us = run_beside(s, d);
        if (us == 0 && together > 0) {
            together--;
            us = 1; /* seen at once in one report: how long, not known */
        }
        if (us > 0) {
            d->overlap = VERDICT_COPY_OVERLAP;
            d->overlap_us = us;
        }
    }
}

/* Replays message m into s->d[0..*n): every field of struct verdict_delivery. */
static int replay_message(const struct verdict *v, const struct verdict_msg *m,
                          struct vd_scratch *s, size_t *n)
{
    if (replay_events(v, m, s, n) != 0 || classify_all(v, s, *n) != 0)
        return -1;
    runs_upgrade(s, *n);
    return 0;
}

static int span_cmp(const void *a, const void *b)
{
    const struct vd_span *x = a, *y = b;
    if (x->session != y->session)
        return x->session < y->session ? -1 : 1;
    return x->t < y->t ? -1 : x->t > y->t;
}

/* Appends the spans of the live deliveries d[0..n) to v->spans, a span ending at its
 * delivery's latest possible end: for a guessed settlement, the message's last (last_settle).
 * -1 when out of memory. */
static int spans_add(struct verdict *v, const struct verdict_delivery *d, size_t n, size_t *cap,
                     uint64_t last_settle)
{
    for (size_t i = 0; i < n; i++) {
        if (d[i].withheld)
            continue;
        if (v->n_spans == *cap) {
            size_t c = *cap != 0 ? *cap * 2 : 256;
            struct vd_span *p = realloc(v->spans, c * sizeof(*p));
            if (p == NULL)
                return -1;
            v->spans = p;
            *cap = c;
        }
        uint64_t end = !d[i].settled        ? (d[i].closed_us != 0 ? d[i].closed_us : UINT64_MAX)
                       : d[i].settled_guess ? last_settle
                                            : d[i].settled_us;
        v->spans[v->n_spans++] =
            (struct vd_span){(uint32_t)d[i].session, d[i].ev, d[i].time_us, end, 0};
    }
    return 0;
}

/* Sorts the CLOSE records and builds the connections' spans (verdict.spans), once after the
 * records: no change a caller sees, v stays const as far as what it answers goes.  0, or -1
 * when out of memory. */
static int vd_prepare(const struct verdict *v)
{
    struct verdict *mv = (struct verdict *)v;
    sort_closes(v);
    if (mv->spans_built)
        return 0;
    mv->n_spans = 0;
    size_t cap = 0, pos = 0, n = 0;
    struct vd_scratch s = {0};
    const struct strmap_slot *slot = NULL;
    int rc = 0;
    while (rc == 0 && strmap_next(&v->msgs, &pos, &slot)) {
        const struct verdict_msg *m = slot->value;
        if (m != NULL && m->first_ev != VD_NONE)
            rc = replay_events(v, m, &s, &n) == 0 ? spans_add(mv, s.d, n, &cap, s.last_settle_us)
                                                  : -1;
    }
    scratch_free(&s);
    if (rc != 0)
        return -1;
    if (mv->n_spans > 1)
        qsort(mv->spans, mv->n_spans, sizeof(*mv->spans), span_cmp);
    for (size_t i = 0; i < mv->n_spans; i++) {
        struct vd_span *p = &mv->spans[i];
        bool same = i > 0 && p[-1].session == p->session;
        p->maxend = same && p[-1].maxend > p->end ? p[-1].maxend : p->end;
    }
    mv->spans_built = true;
    return 0;
}

/* ---- the rows -------------------------------------------------------------------------- */

/* Keeps the VERDICT_EXAMPLES_MAX smallest ids (strcmp order), sorted. */
static void examples_add(struct verdict_examples *ex, const char *id)
{
    size_t i = ex->n;
    if (i == VERDICT_EXAMPLES_MAX) {
        if (strcmp(id, ex->ids[i - 1]) >= 0)
            return;
        i--;
    } else {
        ex->n++;
    }
    while (i > 0 && strcmp(id, ex->ids[i - 1]) < 0) {
        ex->ids[i] = ex->ids[i - 1];
        i--;
    }
    ex->ids[i] = id;
}

/* A growing array of delays (microseconds), one per task row. */
struct vd_series {
    uint64_t *v;
    size_t n, cap;
};

static int series_add(struct vd_series *s, uint64_t x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap != 0 ? s->cap * 2 : 16;
        uint64_t *v = realloc(s->v, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts s and gives its min, median and max. */
static void series_stats(struct vd_series *s, uint64_t *min, uint64_t *median, uint64_t *max)
{
    if (s->n == 0)
        return;
    qsort(s->v, s->n, sizeof(*s->v), u64_cmp);
    size_t n = s->n;
    if (min != NULL)
        *min = s->v[0];
    *median = n % 2 ? s->v[n / 2] : (s->v[n / 2 - 1] + s->v[n / 2]) / 2;
    *max = s->v[n - 1];
}

/* A set of listener or instance indices (each below 256). */
struct vd_bits {
    uint64_t w[4];
};

/* Per row, while the messages are folded in. */
struct vd_row_acc {
    struct vd_series delays, overlaps;
    uint8_t listener; /* the smallest listener index of its messages' first deliveries */
    struct vd_bits listeners, instances; /* every delivery and settlement went through */
};

/* The listeners and instances m's deliveries and settlements went through, into acc. */
static void note_seen(const struct verdict *v, const struct verdict_msg *m, struct vd_row_acc *acc)
{
    for (uint32_t i = m->first_ev; i != VD_NONE; i = v->evs[i].next) {
        const struct vd_ev *e = &v->evs[i];
        if (e->kind == VD_RUNNING)
            continue;
        unsigned li = (unsigned)(e->aux & 0xff);
        if (li < v->n_listeners)
            acc->listeners.w[li / 64] |= 1ull << (li % 64);
        uint32_t run = e->session != 0 ? v->runs.conns[e->session].run : VD_RUN_NONE;
        if (run != VD_RUN_NONE) {
            unsigned ii = v->runs.runs[run].instance;
            acc->instances.w[ii / 64] |= 1ull << (ii % 64);
        }
    }
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The names of the set bits of b (names[i] for bit i), in strcmp order: the first
 * VERDICT_SEEN_MAX into out[], how many in all into *total. */
static void seen_names(const struct vd_bits *b, const char *const *names, size_t n_names,
                       const char **out, size_t *n, size_t *total)
{
    const char *all[256];
    size_t k = 0;
    for (size_t i = 0; i < n_names && i < 256; i++)
        if (b->w[i / 64] & (1ull << (i % 64)))
            all[k++] = names[i];
    qsort(all, k, sizeof(*all), name_cmp);
    *total = k;
    *n = k < VERDICT_SEEN_MAX ? k : VERDICT_SEEN_MAX;
    memcpy(out, all, *n * sizeof(*out));
}

/* What one message's replay says, summed for its row. */
struct vd_msg_sum {
    uint32_t live;          /* deliveries not withheld */
    uint32_t copies;        /* copies that reached the handler */
    uint32_t set_aside;     /* later deliveries not counted as copies */
    bool overlapped;        /* one of its copies overlapped */
    bool unfinished_last;   /* its last delivery is live and was never settled (settling) */
    uint8_t first_listener; /* its first delivery's listener, or VD_LISTENERS_MAX */
};

static int sum_message(const struct verdict *v, struct vd_scratch *s, size_t n,
                       struct verdict_task *t, struct vd_row_acc *acc, struct vd_msg_sum *sum)
{
    memset(sum, 0, sizeof(*sum));
    sum->first_listener = n > 0 ? s->listener[0] : VD_LISTENERS_MAX;
    for (size_t i = 0; i < n; i++) {
        const struct verdict_delivery *d = &s->d[i];
        if (d->withheld)
            continue;
        sum->live++;
        sum->set_aside += d->set_aside;
        if (d->overlap == VERDICT_COPY_NONE)
            continue;
        sum->copies++;
        if (series_add(&acc->delays, d->copy_delay_us) != 0)
            return -1;
        if (d->overlap == VERDICT_COPY_OVERLAP) {
            t->overlapping++;
            sum->overlapped = true;
            if (series_add(&acc->overlaps, d->overlap_us) != 0)
                return -1;
        } else if (d->overlap == VERDICT_COPY_AFTER) {
            t->sequential++;
        } else {
            t->overlap_unknown++;
        }
    }
    if (n > 0) {
        const struct verdict_delivery *last = &s->d[n - 1];
        sum->unfinished_last = !last->withheld && !last->settled && !last->auto_ack &&
                               listener_settles(v, s->listener[n - 1]);
    }
    return 0;
}

/* Adds one message to its row. */
static int tally(const struct verdict *v, struct vd_scratch *s, struct verdict_task *t,
                 struct vd_row_acc *acc, const char *id, const struct verdict_msg *m)
{
    size_t n = 0;
    struct vd_msg_sum sum;
    if (replay_message(v, m, s, &n) != 0 || sum_message(v, s, n, t, acc, &sum) != 0)
        return -1;
    if (sum.first_listener < acc->listener)
        acc->listener = sum.first_listener;
    note_seen(v, m, acc);
    t->messages++;
    t->faulted += m->faults > 0;
    uint32_t retries = m->attempts > 1 ? m->attempts - 1 : 0;
    if (m->retries > retries)
        retries = m->retries; /* counted by the framework, earlier attempts unseen */
    if (retries > 0) {
        t->retried++;
        if (retries > t->max_retries)
            t->max_retries = retries;
    }
    /* A dropped delivery (whose copy may come later), an attempt the app asked for, a
     * redelivery of a delivery no worker was seen to finish: none tests idempotency; only a
     * copy does. */
    bool copied = sum.copies > 0;
    t->delivered_more_than_once += copied;
    t->copies += sum.copies;
    if (sum.overlapped)
        examples_add(&t->overlap_examples, id);
    if (sum.set_aside > 0) {
        t->set_aside += sum.set_aside;
        t->set_aside_messages++;
        examples_add(&t->set_aside_examples, id);
    }
    /* Work lost: delivered (or withheld), or faulted before its delivery (a
     * dropped publish), and no effect. */
    t->no_effect += m->effects == 0 && (m->delivers >= 1 || m->faults > 0);
    if (m->failed) {
        t->failed++;
        examples_add(&t->failed_examples, id);
    }
    if (m->abandoned) {
        t->abandoned++;
        examples_add(&t->abandoned_examples, id);
    }
    if (m->effects >= 2) {
        t->more_than_one_effect++;
        examples_add(&t->examples, id);
        if (sum.live <= 1) {
            t->doubled_single_delivery++;
            examples_add(&t->single_examples, id);
        } else if (!copied && sum.set_aside == 0) {
            t->doubled_by_retries++;
            examples_add(&t->retry_examples, id);
        }
    }
    /* Work that stopped (a failed message settled for good: counted in `failed`). */
    bool never = m->published && m->delivers == 0 && m->waiting;
    bool unfinished = m->delivers > 0 && !m->failed && (m->waiting || sum.unfinished_last);
    t->never_delivered += never;
    t->unfinished += unfinished;
    if (never || unfinished)
        examples_add(&t->outstanding_examples, id);
    uint64_t progress = m->progress_us != 0 ? m->progress_us : m->publish_us;
    if (progress > t->last_progress_us)
        t->last_progress_us = progress;
    return 0;
}

static void tally_unknown(struct verdict_result *res, const char *id, const struct verdict_msg *m)
{
    res->unknown_effect_ids++;
    res->unknown_effect_lines += m->effects;
    examples_add(&res->unknown_examples, id);
}

static int task_cmp(const void *a, const void *b)
{
    const struct verdict_task *x = a, *y = b;
    if (x->unknown != y->unknown)
        return x->unknown ? 1 : -1;
    return strcmp(x->task, y->task);
}

/* The evidence row t lacks, and whether it falls short of what opt requires. */
static void row_evidence(struct verdict_task *t, const struct verdict_options *opt)
{
    const struct verdict_require *rq = &opt->require;
    if (t->copies == 0)
        t->missing |= VERDICT_MISSING_COPIES;
    if (t->overlapping == 0)
        t->missing |= VERDICT_MISSING_OVERLAP;
    uint64_t window = rq->window_us != 0 ? rq->window_us : VERDICT_SHORT_WINDOW_US;
    if (t->copies == 0 || t->copy_max_us < window)
        t->missing |= VERDICT_MISSING_WINDOW;
    t->required_short = t->copies < rq->copies || t->overlapping < rq->overlaps ||
                        (rq->window_us != 0 && (t->copies == 0 || t->copy_max_us < rq->window_us));
}

/* Sets each row's verdict, drops empty rows, sorts, sets the overall verdict. */
static void finish_rows(struct verdict_result *res, size_t rows, const struct verdict_options *opt)
{
    size_t n = 0;
    res->overall = VERDICT_UNTESTED;
    for (size_t i = 0; i < rows; i++) {
        struct verdict_task *t = &res->tasks[i];
        if (t->messages == 0)
            continue;
        row_evidence(t, opt);
        /* Only a copy that reached the handler tests it: faults that only dropped or delayed
         * work prove nothing either way, nor does a copy no worker was seen to finish. */
        if (t->more_than_one_effect > 0)
            t->verdict = VERDICT_NOT_IDEMPOTENT;
        else if (t->copies > 0 && !t->required_short)
            t->verdict = VERDICT_IDEMPOTENT;
        else
            t->verdict = VERDICT_UNTESTED;
        bool outstanding = t->never_delivered + t->unfinished > 0;
        t->stalled = outstanding && res->end_us >= t->last_progress_us + opt->stall_after_us;
        res->any_stalled |= t->stalled;
        res->any_required_short |= t->required_short && t->verdict != VERDICT_NOT_IDEMPOTENT;
        if (t->verdict > res->overall)
            res->overall = t->verdict;
        res->tasks[n++] = *t;
    }
    res->n_tasks = n;
    qsort(res->tasks, n, sizeof(*res->tasks), task_cmp);
}

/* What the effects list says of itself against the journal. */
static void effects_check(const struct verdict *v, struct verdict_result *res)
{
    uint64_t matched = res->effect_lines - res->unknown_effect_lines;
    res->effect_lines_with_comma = v->comma_lines;
    if (res->effect_lines == 0)
        res->effects_check =
            res->delivered_messages > 0 ? VERDICT_EFFECTS_EMPTY : VERDICT_EFFECTS_OK;
    else if (matched == 0)
        res->effects_check = VERDICT_EFFECTS_NO_MATCH;
    else if (res->unknown_effect_lines * 2 > res->effect_lines)
        res->effects_check = VERDICT_EFFECTS_MOSTLY_OFF;
    else
        res->effects_check = VERDICT_EFFECTS_OK;
}

/* Each row's delays and listener, from the accumulators. */
static void rows_finish_acc(const struct verdict *v, struct verdict_result *out,
                            struct vd_row_acc *acc, size_t rows)
{
    for (size_t r = 0; r < rows; r++) {
        struct verdict_task *t = &out->tasks[r];
        series_stats(&acc[r].delays, &t->copy_min_us, &t->copy_median_us, &t->copy_max_us);
        series_stats(&acc[r].overlaps, NULL, &t->overlap_median_us, &t->overlap_max_us);
        const char *lnames[VD_LISTENERS_MAX];
        for (size_t i = 0; i < v->n_listeners; i++)
            lnames[i] = v->listeners[i].name;
        seen_names(&acc[r].listeners, lnames, v->n_listeners, t->seen_listeners,
                   &t->n_seen_listeners, &t->seen_listeners_total);
        seen_names(&acc[r].instances, v->runs.instance_names, v->runs.n_instances,
                   t->seen_instances, &t->n_seen_instances, &t->seen_instances_total);
        if (acc[r].listener < v->n_listeners) {
            const struct vd_listener *l = &v->listeners[acc[r].listener];
            t->listener = l->name;
            t->protocol = l->protocol;
            t->profile = l->profile;
            t->visibility_ms = l->visibility_ms;
            t->consumer_timeout = l->consumer_timeout;
        }
    }
}

static int fold_messages(const struct verdict *v, struct verdict_result *out,
                         struct vd_row_acc *acc)
{
    struct vd_scratch s = {0};
    size_t pos = 0;
    const struct strmap_slot *slot = NULL;
    int rc = 0;
    while (rc == 0 && strmap_next(&v->msgs, &pos, &slot)) {
        const struct verdict_msg *m = slot->value;
        if (m == NULL)
            continue;
        out->effect_lines += m->effects;
        if (!m->in_journal) {
            tally_unknown(out, slot->key, m);
            continue;
        }
        size_t r = m->task == VERDICT_NO_TASK ? v->n_tasks : m->task;
        out->delivered_messages += m->delivers > 0;
        rc = tally(v, &s, &out->tasks[r], &acc[r], slot->key, m);
    }
    scratch_free(&s);
    return rc;
}

int verdict_compute_with(const struct verdict *v, const struct verdict_options *opt,
                         struct verdict_result *out)
{
    struct verdict_options dflt = {0};
    struct verdict_options o = opt != NULL ? *opt : dflt;
    if (o.stall_after_us == 0)
        o.stall_after_us = VERDICT_STALL_AFTER_US;
    memset(out, 0, sizeof(*out));
    out->end_us = v->end_us;
    if (vd_prepare(v) != 0)
        return -1;
    size_t rows = v->n_tasks + 1; /* the last row collects messages with no task */
    out->tasks = calloc(rows, sizeof(*out->tasks));
    struct vd_row_acc *acc = calloc(rows, sizeof(*acc));
    int rc = out->tasks != NULL && acc != NULL ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < rows; i++) {
        out->tasks[i].task = i < v->n_tasks ? v->task_names[i] : VERDICT_UNKNOWN_TASK;
        out->tasks[i].unknown = i == v->n_tasks;
        acc[i].listener = VD_LISTENERS_MAX;
    }
    if (rc == 0)
        rc = fold_messages(v, out, acc);
    if (rc == 0)
        rows_finish_acc(v, out, acc, rows);
    for (size_t i = 0; acc != NULL && i < rows; i++) {
        free(acc[i].delays.v);
        free(acc[i].overlaps.v);
    }
    free(acc);
    if (rc != 0) {
        verdict_result_free(out);
        return -1;
    }
    finish_rows(out, rows, &o);
    effects_check(v, out);
    return 0;
}

int verdict_compute(const struct verdict *v, struct verdict_result *out)
{
    return verdict_compute_with(v, NULL, out);
}

void verdict_result_free(struct verdict_result *res)
{
    free(res->tasks);
    memset(res, 0, sizeof(*res));
}

/* d's keyed session back to the journal, twice run and instance it belongs to and its id
 * there, as journaled. */
static void unkey_session(const struct verdict *v, struct verdict_delivery *d)
{
    uint32_t key = (uint32_t)d->session;
    uint32_t run = key != 0 && key < v->runs.n_conns ? v->runs.conns[key].run : VD_RUN_NONE;
    if (key != 0 && key < v->runs.n_conns)
        d->session = v->runs.conns[key].session;
    if (run == VD_RUN_NONE) {
        /* no connection named (or no header): the first run's, when there is one */
        d->twice_run = v->runs.n_runs > 0 ? 1 : 0;
        d->journal = v->runs.n_runs > 0 ? 1 : 0;
        d->instance = vd_runs_instance(&v->runs, 0);
        return;
    }
    d->twice_run = v->runs.runs[run].number;
    d->journal = v->runs.runs[run].source + 1;
    d->instance = vd_runs_instance(&v->runs, run);
}

int verdict_message_deliveries(const struct verdict *v, const char *id,
                               struct verdict_delivery **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    const struct verdict_msg *m = strmap_get(&v->msgs, id);
    if (m == NULL || !m->in_journal)
        return 0;
    if (vd_prepare(v) != 0)
        return -1;
    struct vd_scratch s = {0};
    int rc = replay_message(v, m, &s, n);
    if (rc == 0 && *n > 0) {
        *out = malloc(*n * sizeof(**out));
        if (*out != NULL)
            memcpy(*out, s.d, *n * sizeof(**out));
        else
            rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < *n; i++) {
        unkey_session(v, &(*out)[i]);
        (*out)[i].listener =
            s.listener[i] < v->n_listeners ? v->listeners[s.listener[i]].name : NULL;
    }
    scratch_free(&s);
    return rc == 0 ? 1 : -1;
}

uint32_t verdict_message_effects(const struct verdict *v, const char *id)
{
    const struct verdict_msg *m = strmap_get(&v->msgs, id);
    return m != NULL ? m->effects : 0;
}

static int id_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int verdict_each_message(const struct verdict *v,
                         int (*fn)(void *ctx, const char *id, const char *task), void *ctx)
{
    const char **ids =
        malloc((strmap_count(&v->msgs) != 0 ? strmap_count(&v->msgs) : 1) * sizeof(*ids));
    if (ids == NULL)
        return -1;
    size_t pos = 0, n = 0;
    const struct strmap_slot *slot = NULL;
    while (strmap_next(&v->msgs, &pos, &slot)) {
        const struct verdict_msg *m = slot->value;
        if (m != NULL && m->in_journal)
            ids[n++] = slot->key;
    }
    qsort(ids, n, sizeof(*ids), id_cmp);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const struct verdict_msg *m = strmap_get(&v->msgs, ids[i]);
        rc = fn(ctx, ids[i], m->task != VERDICT_NO_TASK ? v->task_names[m->task] : NULL);
    }
    free(ids);
    return rc;
}

/* ---- the effects file ---------------------------------------------------------------------- */

/* Strips blanks and a trailing \r; returns the id, or NULL for a line to skip. */
static char *effect_line_id(char *line)
{
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
                       line[len - 1] == '\t'))
        line[--len] = '\0';
    while (*line == ' ' || *line == '\t')
        line++;
    if (*line == '\0' || *line == '#')
        return NULL;
    return line;
}

int verdict_load_effects(struct verdict *v, const char *path, uint64_t *lines, char *err,
                         size_t errlen)
{
    FILE *fp = fopen(path, "r");
    if (fp == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    *lines = 0;
    while (rc == 0 && getline(&line, &cap, fp) >= 0) {
        const char *id = effect_line_id(line);
        if (id == NULL)
            continue;
        verdict_note_effect_line_shape(v, id);
        rc = verdict_add_effect(v, id);
        (*lines)++;
    }
    if (rc == 0 && ferror(fp)) {
        snprintf(err, errlen, "%s: read error", path);
        rc = -1;
    } else if (rc != 0) {
        snprintf(err, errlen, "%s: out of memory", path);
    }
    free(line);
    fclose(fp);
    return rc;
}
