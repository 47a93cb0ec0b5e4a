/*
 * framework.h - a job framework on Redis as one module: what its commands and replies mean, and
 * what it would answer or do after a fault (proto/jobs/job.h, proto/resp/resp_plan.h).
 *
 * A module is a table of functions the RESP hook calls for a listener of its profile: every
 * command as it passes, a command outside a transaction, the reply of one whose plan tagged it,
 * a transaction read whole before its MULTI goes on and the elements of its EXEC's reply.
 * Registered in proto/jobs/frameworks.c.  What the modules share is proto/jobs/common.h.
 */
#ifndef TWICE_JOBS_FRAMEWORK_H
#define TWICE_JOBS_FRAMEWORK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/jobs/job.h"
#include "proto/resp/resp.h"
#include "proto/resp/resp_plan.h"
#include "proto/resp/resp_profile.h"

struct resp_framework;

/* What becomes of one command queued in a transaction. */
struct resp_queued {
    bool keep_back;            /* twice answers +QUEUED; EXEC's array gets .answer for it */
    struct resp_bytes answer;  /* keep_back: one reply */
    int64_t reply_add;         /* forwarded: added to its integer element of EXEC's array */
    struct resp_reply_tag tag; /* its element of EXEC's array read by the module (element()) */
};

/*
 * The plan of a transaction, made once it is read whole, before its MULTI goes on: cmds[0..n),
 * one per queued command (malloc'd by the module, owned by the plan).  Own commands due at 0 ms
 * go out as EXEC goes on, the others that much later; after_exec ones once EXEC's reply shows
 * the transaction ran.
 */
struct resp_tx_plan {
    struct resp_queued *cmds;
    size_t n;
    struct resp_own own[RESP_PLAN_OWN_MAX];
    size_t n_own;
    struct resp_own after_exec;
    const void *cut_before; /* the transaction never reaches Redis: cut at MULTI */
    const void *cut_after;  /* cut once EXEC's reply went out */
    bool hold;              /* held hold_ms, then read again, decided */
    uint32_t hold_ms;
};

/* Frees what a transaction's plan holds, tags included (through fw). */
void resp_tx_plan_free(const struct resp_framework *fw, struct resp_tx_plan *p);

struct resp_framework {
    const char *name; /* the listener's `profile` */
    enum rprof prof;
    /* Without the journal or a rule on job events, a pop's reply is only counted as a delivery
     * (the host passes it on unread; count_pop() says whether it carried a job). */
    bool (*count_pop)(const struct job_host *h, const struct resp_reply_tag *tag,
                      const uint8_t *buf, const struct resp_msg *m);
    /* The module's state for a new session (NULL allowed), and its end. */
    void *(*open)(void);
    void (*close)(void *state);
    /* Every command as it passes, queued in a transaction or not, before anything is decided
     * about it (Sidekiq's heartbeat lists the jobs in progress). */
    void (*seen)(const struct job_host *h, const struct rprof_cmdview *cv);
    /* A command outside a transaction: 1 when it is one the module reads and *p (zeroed by the
     * caller) is its plan; 0 when it is not (the host handles it as any command).  `decided`:
     * the command comes back after a hold its plan asked for; it is not decided again. */
    int (*command)(const struct job_host *h, const struct rprof_cmdview *cv, bool decided,
                   struct resp_cmd_plan *p);
    /* The reply m (in buf) to a command whose plan tagged it; *p zeroed by the caller. */
    void (*reply)(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                  const struct resp_msg *m, struct resp_reply_plan *p);
    /* A transaction in buf[off..len) (from just after MULTI; the session's scanner limit
     * max_bulk): 1 with *p (zeroed by the caller) its plan, 0 when its EXEC is not here yet,
     * -1 when it is not one the module plans (it goes on as it came; *p to be freed all the
     * same). */
    int (*transaction)(const struct job_host *h, const uint8_t *buf, size_t len, size_t off,
                       uint64_t max_bulk, struct resp_tx_plan *p);
    /* Whether a MULTI alone waits for the rest of its transaction (RPX_TX_WAIT_MS at most):
     * the listener's rules judge what transactions carry. */
    bool (*tx_judged)(const struct job_host *h);
    /* That element, v in buf, when the transaction ran. */
    void (*element)(const struct job_host *h, const struct resp_reply_tag *tag, const uint8_t *buf,
                    const struct resp_view *v);
    /* Frees a tag's state (NULL allowed). */
    void (*free_state)(uint8_t kind, void *state);
};

/* The registry of profiles: how many framework modules there are, and the i-th (NULL past
 * the last), in the order the documentation lists them.  A listener's `profile` is one of
 * their names. */
size_t resp_framework_count(void);
const struct resp_framework *resp_framework_at(size_t i);

/* The module of a profile, or NULL for RPROF_NONE (commands only). */
const struct resp_framework *resp_framework_of(enum rprof p);

/* A tag's state freed by its module (NULL fw or state allowed). */
void resp_framework_free_tag(const struct resp_framework *fw, struct resp_reply_tag *tag);

#endif
