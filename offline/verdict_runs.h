/*
 * verdict_runs.h - the twice runs the verdict reads, and their connections, keyed apart.
 *
 * A connection is a journal, a twice run of it and a session id: session ids start at 1 in
 * every run (journal.proto), so connection 3 of one instance's journal is not connection 3 of
 * another's, nor of the run before it in the same file (`journal PATH append`).  The verdict
 * (verdict.c) keys each record's connection to a small dense number, the same for every record
 * of that connection whatever order the journals' records are read in (merged by time,
 * offline/journal_set.h), and back to its journal, run, instance and session id for output.
 *
 * A message is keyed by its id alone, in every journal: a message delivered through one
 * instance and acked through another is one message (docs/instances.md).
 *
 * Internal to offline/verdict.c.  Pure C, no I/O.
 */
#ifndef TWICE_VERDICT_RUNS_H
#define TWICE_VERDICT_RUNS_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "offline/strmap.h"
#include "proto/base/hmap.h"

/* A record read before any header (the accumulator fed without one, as tests do). */
#define VD_RUN_NONE UINT32_MAX
/* Instance names told apart; the runs of instances past it share the last index. */
#define VD_INSTANCES_MAX 255u

/* One twice run of one journal. */
struct vd_trun {
    uint32_t source;  /* the journal, 0-based, as the caller numbers them */
    uint32_t number;  /* 1 for the journal's first run */
    uint8_t instance; /* index into vd_runs.instance_names */
    uint64_t last_us; /* its last record */
};

/* One connection: its run and its session id there. */
struct vd_conn {
    uint32_t run; /* VD_RUN_NONE: no header */
    bool delivered;
    uint64_t session;
};

struct vd_runs {
    struct vd_trun *runs;
    size_t n_runs, cap_runs;
    uint32_t *current; /* per journal: its run now read + 1, 0 before its first header */
    size_t n_sources;
    struct vd_conn *conns; /* by key; key 0 is "no connection named" */
    uint32_t n_conns, cap_conns;
    struct hmap conn_index;     /* (run, session) -> conn key, as a pointer */
    struct strmap instance_ids; /* name -> index + 1 */
    const char *instance_names[VD_INSTANCES_MAX];
    size_t n_instances;
};

void vd_runs_free(struct vd_runs *rs);

/*
 * Starts a twice run of journal `source` (its first header, or a later run's), written by
 * `instance`.  *prev: the journal's run before it (VD_RUN_NONE for none), which ended here.
 * *run: the new run.  0, or -1 when out of memory.
 */
int vd_runs_begin(struct vd_runs *rs, uint32_t source, const char *instance, uint32_t *prev,
                  uint32_t *run) TWICE_MUST_CHECK;

/* The run of journal `source` now read, or VD_RUN_NONE before its first header. */
uint32_t vd_runs_current(const struct vd_runs *rs, uint32_t source);

/* The key of connection `session` of `run` (0 for session 0), added when new.  0, or -1 when
 * out of memory (or past UINT32_MAX connections). */
int vd_runs_key(struct vd_runs *rs, uint32_t run, uint64_t session, uint32_t *key) TWICE_MUST_CHECK;

/* The instance name of run `run`, or NULL for VD_RUN_NONE. */
const char *vd_runs_instance(const struct vd_runs *rs, uint32_t run);

#endif
