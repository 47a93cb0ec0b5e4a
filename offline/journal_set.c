/*
 * journal_set.c - several journals read as one, merged by time.  See journal_set.h.
 *
 * The merge keeps one pending entry per journal (its reader's current one) and hands out the
 * earliest; the journal it came from is read on at the next call.  Journals are few (one per
 * instance): a linear scan for the earliest is cheaper than a heap at that size.
 */
#include "offline/journal_set.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Appends an owned copy of path.  -1 when out of memory or past JOURNAL_SET_MAX. */
static int paths_push(struct journal_paths *p, const char *path)
{
    if (p->n == JOURNAL_SET_MAX)
        return -1;
    if (p->n == p->cap) {
        size_t cap = p->cap != 0 ? p->cap * 2 : 8;
        char **v = realloc(p->path, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        p->path = v;
        p->cap = cap;
    }
    if ((p->path[p->n] = strdup(path)) == NULL)
        return -1;
    p->n++;
    return 0;
}

void journal_paths_free(struct journal_paths *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->path[i]);
    free(p->path);
    memset(p, 0, sizeof(*p));
}

/* Adds `arg`: the files a glob pattern matches (sorted), or the file it names.  -1 after
 * saying why. */
static int paths_add(struct journal_paths *p, const char *arg, const char *cmd, FILE *err)
{
    bool pattern = strpbrk(arg, "*?[") != NULL;
    glob_t g;
    int rc = pattern ? glob(arg, 0, NULL, &g) : GLOB_NOMATCH;
    if (pattern && rc != 0 && rc != GLOB_NOMATCH) {
        fprintf(err, "twice %s: journal pattern '%s': cannot expand it\n", cmd, arg);
        return -1;
    }
    bool globbed = pattern && rc == 0;
    if (rc == GLOB_NOMATCH) {
        /* A pattern that matches nothing may still be a file's own name ("run[1].pb"). */
        if (pattern && access(arg, F_OK) != 0) {
            fprintf(err, "twice %s: journal pattern '%s' matches no file\n", cmd, arg);
            return -1;
        }
        rc = paths_push(p, arg);
    } else {
        for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++)
            rc = paths_push(p, g.gl_pathv[i]);
    }
    if (globbed)
        globfree(&g);
    if (rc != 0)
        fprintf(err, "twice %s: too many journals (at most %d) or out of memory\n", cmd,
                JOURNAL_SET_MAX);
    return rc != 0 ? -1 : 0;
}

int journal_paths_arg(int argc, char **argv, int *i, struct journal_paths *p, FILE *err)
{
    const char *arg = argv[*i], *value = arg;
    static const char flag[] = "--journal";
    size_t n = sizeof(flag) - 1;
    if (arg[0] == '-' && arg[1] != '\0') { /* "-" alone is a name (stdin's), not an option */
        if (strncmp(arg, flag, n) != 0 || (arg[n] != '\0' && arg[n] != '='))
            return 0;
        value = arg[n] == '=' ? arg + n + 1 : *i + 1 < argc ? argv[++*i] : NULL;
        if (value == NULL || value[0] == '\0') {
            fprintf(err, "twice %s: --journal needs a value\n", argv[0]);
            return -1;
        }
    }
    return paths_add(p, value, argv[0], err) == 0 ? 1 : -1;
}

/* One journal of the set. */
struct set_source {
    struct journal_reader *r;
    const Twice__Journal__Entry *head; /* its next entry, not handed out yet; NULL: read out */
    bool advance;                      /* head was handed out: read the next one first */
    struct journal_info info;
};

struct journal_set {
    struct set_source *src;
    size_t n;
};

void journal_set_close(struct journal_set *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n; i++)
        journal_reader_close(s->src[i].r);
    free(s->src);
    free(s);
}

/* Marks in dup[] each path that names the same file as an earlier one (by device and inode:
 * a glob and a name, or two spellings): it is read once, its records counted once.  false
 * when out of memory. */
static bool mark_duplicates(const struct journal_paths *paths, bool *dup)
{
    struct stat *st = calloc(paths->n != 0 ? paths->n : 1, sizeof(*st));
    bool *ok = calloc(paths->n != 0 ? paths->n : 1, sizeof(*ok));
    for (size_t i = 0; st != NULL && ok != NULL && i < paths->n; i++) {
        ok[i] = stat(paths->path[i], &st[i]) == 0;
        for (size_t j = 0; ok[i] && !dup[i] && j < i; j++)
            dup[i] = ok[j] && st[j].st_dev == st[i].st_dev && st[j].st_ino == st[i].st_ino;
    }
    bool done = st != NULL && ok != NULL;
    free(st);
    free(ok);
    return done;
}

struct journal_set *journal_set_open(const struct journal_paths *paths, char *err, size_t errlen)
{
    struct journal_set *s = calloc(1, sizeof(*s));
    bool *dup = calloc(paths->n != 0 ? paths->n : 1, sizeof(*dup));
    if (s == NULL || dup == NULL || !mark_duplicates(paths, dup) ||
        (s->src = calloc(paths->n != 0 ? paths->n : 1, sizeof(*s->src))) == NULL) {
        snprintf(err, errlen, "out of memory");
        free(dup);
        free(s);
        return NULL;
    }
    for (size_t i = 0; i < paths->n; i++) {
        if (dup[i])
            continue;
        struct set_source *src = &s->src[s->n++];
        if ((src->r = journal_reader_open(paths->path[i], err, errlen)) == NULL) {
            free(dup);
            journal_set_close(s);
            return NULL;
        }
        src->info.path = paths->path[i];
        src->info.header = journal_reader_header(src->r);
        const char *inst = src->info.header->instance;
        src->info.instance = inst != NULL && inst[0] != '\0' ? inst : paths->path[i];
        src->advance = true;
    }
    free(dup);
    return s;
}

size_t journal_set_count(const struct journal_set *s)
{
    return s->n;
}

const struct journal_info *journal_set_info(const struct journal_set *s, size_t i)
{
    return i < s->n ? &s->src[i].info : NULL;
}

/* The time an entry is merged by: a record's, a header's start. */
static uint64_t entry_time(const Twice__Journal__Entry *e)
{
    if (e->body_case == TWICE__JOURNAL__ENTRY__BODY_RECORD)
        return e->record->time_unix_us;
    if (e->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER)
        return e->header->start_unix_ms * 1000u;
    return 0; /* a body this reader does not know: handed out at once, skipped by the caller */
}

/* Reads src's next entry into its head.  -1 on its reader's error (said in err). */
static int source_advance(struct set_source *src, char *err, size_t errlen)
{
    src->advance = false;
    if (src->r == NULL)
        return 0;
    int rc = journal_reader_next(src->r, &src->head);
    if (rc == 1)
        return 0;
    src->head = NULL;
    if (rc == 0)
        return 0;
    const char *why = journal_reader_error(src->r);
    snprintf(err, errlen, "%s: %s", src->info.path, why != NULL ? why : journal_strerror(rc));
    return -1;
}

int journal_set_next(struct journal_set *s, size_t *source, const Twice__Journal__Entry **e,
                     char *err, size_t errlen)
{
    size_t best = SIZE_MAX;
    uint64_t best_t = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct set_source *src = &s->src[i];
        if (src->advance && source_advance(src, err, errlen) != 0)
            return -1;
        if (src->head == NULL)
            continue;
        uint64_t t = entry_time(src->head);
        if (best == SIZE_MAX || t < best_t) {
            best = i;
            best_t = t;
        }
    }
    if (best == SIZE_MAX)
        return 0;
    s->src[best].advance = true;
    *source = best;
    *e = s->src[best].head;
    return 1;
}

void journal_set_finish(struct journal_set *s)
{
    for (size_t i = 0; i < s->n; i++) {
        struct set_source *src = &s->src[i];
        struct journal_info *in = &src->info;
        in->runs = journal_reader_runs(src->r);
        in->unclean_runs = journal_reader_unclean_runs(src->r);
        in->records = journal_reader_count(src->r) - (in->runs - 1);
        in->truncated = journal_reader_truncated(src->r);
        in->clean_stop = journal_reader_clean_stop(src->r);
        damage_report_take(&in->damage, src->r);
    }
}

/* Adds the damage of b to a: the totals, and b's stretches after a's while room is left. */
static void damage_add(struct damage_report *a, const struct damage_report *b)
{
    size_t kept =
        a->sum.stretches < JOURNAL_DAMAGE_KEPT ? (size_t)a->sum.stretches : JOURNAL_DAMAGE_KEPT;
    for (size_t k = 0;
         k < b->sum.stretches && k < JOURNAL_DAMAGE_KEPT && kept < JOURNAL_DAMAGE_KEPT; k++)
        a->list[kept++] = b->list[k];
    a->sum.stretches += b->sum.stretches;
    a->sum.bytes += b->sum.bytes;
    a->sum.records_lost += b->sum.records_lost;
    a->sum.records_unknown |= b->sum.records_unknown;
    a->sum.stopped |= b->sum.stopped;
    a->checksums = a->checksums && b->checksums;
}

void journal_set_total(const struct journal_set *s, struct journal_info *total)
{
    memset(total, 0, sizeof(*total));
    total->clean_stop = true;
    total->damage.checksums = true;
    for (size_t i = 0; i < s->n; i++) {
        const struct journal_info *in = &s->src[i].info;
        if (i == 0) {
            total->path = in->path;
            total->instance = in->instance;
            total->header = in->header;
        }
        total->records += in->records;
        total->runs += in->runs;
        total->unclean_runs += in->unclean_runs;
        total->truncated |= in->truncated;
        total->clean_stop &= in->clean_stop;
        damage_add(&total->damage, &in->damage);
    }
}

bool journal_set_mixed_config(const struct journal_set *s)
{
    const Twice__Journal__Header *h0 = s->n > 0 ? s->src[0].info.header : NULL;
    for (size_t i = 1; i < s->n; i++) {
        const Twice__Journal__Header *h = s->src[i].info.header;
        if (h->seed != h0->seed)
            return true;
    }
    return false;
}
