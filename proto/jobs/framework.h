/*
 * framework.h - a job framework on Redis as one module: what its commands and replies mean, and
 * what it would answer or do after a fault (proto/jobs/job.h, proto/resp_plan.h).
 *
 * A module is a table of functions the RESP hook calls for a listener of its profile: a command
 * outside a transaction, the reply of one whose plan tagged it, a command queued in a
 * transaction and its element of EXEC's reply.  Registered in proto/jobs/frameworks.c.
 */
#ifndef TWICE_JOBS_FRAMEWORK_H
#define TWICE_JOBS_FRAMEWORK_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/jobs/job.h"
#include "proto/resp.h"
#include "proto/resp_plan.h"
#include "proto/resp_profile.h"

struct resp_framework {
    const char *name; /* the listener's `profile` */
    enum rprof prof;
    /* A command outside a transaction: 1 when it is one the module reads and *p (zeroed by the
     * caller) is its plan; 0 when it is not (the host handles it as any command).  `decided`:
     * the command comes back after a hold its plan asked for; it is not decided again. */
    int (*command)(const struct job_host *h, const struct rprof_cmdview *cv, bool decided,
                   struct resp_cmd_plan *p);
    /* The reply m (in buf) to a command whose plan tagged it; *p zeroed by the caller. */
    void (*reply)(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                  const struct resp_msg *m, struct resp_reply_plan *p);
    /* A command queued in a transaction: a tag for its element of EXEC's reply ({0}: none). */
    struct resp_reply_tag (*queued)(const struct job_host *h, const struct rprof_cmdview *cv);
    /* That element, v in buf, when the transaction ran. */
    void (*element)(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                    const struct resp_view *v);
    /* Frees a tag's state (NULL allowed). */
    void (*free_state)(uint8_t kind, void *state);
};

/* The module of a profile, or NULL when the profile has none (yet: the others are read by
 * proto/resp_profile.h and decided in the proxy). */
const struct resp_framework *resp_framework_of(enum rprof p);

/* A tag's state freed by its module (NULL fw or state allowed). */
void resp_framework_free_tag(const struct resp_framework *fw, struct resp_reply_tag *tag);

#endif
