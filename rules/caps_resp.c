/*
 * caps_resp.c - what the resp codec can do, per profile.
 *
 * Every resp listener sees `command` (each command a client sends, matched
 * by name and first key).  A profile teaches twice one job framework's
 * commands (kombu's transport/redis.py, Sidekiq's fetch.rb and client.rb, RQ's
 * queue.py and worker.py, Redis's consumer-group commands, the reliable-queue pattern of
 * plain lists): which reply is a delivery,
 * which command a publish, which transaction an ack.  Sidekiq's basic fetch
 * has no ack at all, so rules on `ack` are refused there with the reason.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "proto/jobs/framework.h"
#include "rules/caps.h"

/* Room for a reason that names every profile. */
#define RESP_PROFILE_TEXT_BYTES 256

#define STREAM_ACTIONS                                                                             \
    (CAPS_BIT(RULE_ACT_LATENCY) | CAPS_BIT(RULE_ACT_BANDWIDTH) | CAPS_BIT(RULE_ACT_SLICE) |        \
     CAPS_BIT(RULE_ACT_RESET) | CAPS_BIT(RULE_ACT_BLACKHOLE) | CAPS_BIT(RULE_ACT_SLOW_CLOSE) |     \
     CAPS_BIT(RULE_ACT_LIMIT))

#define JOB_FIELDS                                                                                 \
    (CAPS_BIT(RULE_F_QUEUE) | CAPS_BIT(RULE_F_MESSAGE_ID) | CAPS_BIT(RULE_F_TASK) |                \
     CAPS_BIT(RULE_F_CLIENT) | CAPS_BIT(RULE_F_KEY))

#define CLOSE_DELAY_DROP                                                                           \
    (CAPS_BIT(RULE_ACT_CLOSE) | CAPS_BIT(RULE_ACT_DELAY) | CAPS_BIT(RULE_ACT_DROP))

static const char *common_why_not(enum rule_event ev, enum rule_action_kind act)
{
    switch (act) {
    case RULE_ACT_REDELIVER:
        return "redeliver loses an ack after the work was done: use it on 'ack'";
    case RULE_ACT_DUPLICATE:
        return "it sends a job twice: use it on 'deliver' (a second worker gets it) or "
               "'publish' (Redis gets the push twice)";
    case RULE_ACT_EXPIRE:
        return "Redis job queues have no per-delivery timer to imitate: use 'redeliver' on "
               "'ack', or 'delay' past the visibility timeout";
    case RULE_ACT_ERROR:
        return ev == RULE_EV_COMMAND ? NULL
                                     : "an error reply is a command fault: use 'when command'";
    default:
        return NULL;
    }
}

/* The reason a listener without a profile has no job event, naming every profile of the
 * registry (proto/jobs/framework.h); made once. */
static char plain_no_jobs[RESP_PROFILE_TEXT_BYTES];
static pthread_once_t plain_no_jobs_once = PTHREAD_ONCE_INIT;

static void plain_no_jobs_make(void)
{
    size_t n = resp_framework_count(), used = 0;
    int w = snprintf(plain_no_jobs, sizeof(plain_no_jobs),
                     "a resp listener without a profile sees commands only: add ");
    used = w > 0 ? (size_t)w : 0;
    for (size_t i = 0; i < n && used < sizeof(plain_no_jobs); i++) {
        w = snprintf(plain_no_jobs + used, sizeof(plain_no_jobs) - used, "%s'%s%s'",
                     i == 0       ? ""
                     : i + 1 == n ? " or "
                                  : ", ",
                     i == 0 ? "profile " : "", resp_framework_at(i)->name);
        used += w > 0 ? (size_t)w : 0;
    }
    if (used < sizeof(plain_no_jobs))
        snprintf(plain_no_jobs + used, sizeof(plain_no_jobs) - used, " for job events");
}

static const char *plain_why_not(enum rule_event ev, enum rule_action_kind act)
{
    if (act == RULE_ACT_COUNT && ev != RULE_EV_COMMAND) {
        pthread_once(&plain_no_jobs_once, plain_no_jobs_make);
        return plain_no_jobs;
    }
    return common_why_not(ev, act);
}

static const char *sidekiq_why_not(enum rule_event ev, enum rule_action_kind act)
{
    if (act == RULE_ACT_COUNT && ev == RULE_EV_ACK)
        return "Sidekiq's basic fetch never acks: a job exists only in the worker once popped "
               "(use 'drop' or 'close before' on 'deliver' for a lost job)";
    if (act == RULE_ACT_COUNT && (ev == RULE_EV_NACK || ev == RULE_EV_CONFIRM))
        return "this is an AMQP event";
    return common_why_not(ev, act);
}

static const char *job_why_not(enum rule_event ev, enum rule_action_kind act)
{
    if (act == RULE_ACT_COUNT && (ev == RULE_EV_NACK || ev == RULE_EV_CONFIRM))
        return "this is an AMQP event";
    return common_why_not(ev, act);
}

static const char *streams_why_not(enum rule_event ev, enum rule_action_kind act)
{
    if (ev == RULE_EV_PUBLISH && act == RULE_ACT_DUPLICATE)
        return "an XADD sent twice makes two entries with two ids: consumers would see two "
               "messages, not one message twice";
    return job_why_not(ev, act);
}

/* Late copies are pushes twice makes D later on its own connection: a job of
 * a list can be pushed again at any time; a stream entry or a Celery job left
 * unacked comes back when the framework's own timer says. */
static const char *celery_why_not_late(enum rule_event ev, enum rule_action_kind act)
{
    if (ev == RULE_EV_ACK && act == RULE_ACT_REDELIVER)
        return "kombu's Redis transport restores a job whose ack never landed "
               "visibility_timeout after its delivery (QoS.restore_visible), at a time twice "
               "does not choose: use 'do redeliver' with the transport's visibility_timeout, or "
               "'do duplicate after D' on 'deliver'";
    return NULL;
}

static const char *streams_why_not_late(enum rule_event ev, enum rule_action_kind act)
{
    (void)ev;
    (void)act;
    return "a pending stream entry is handed out again when a consumer's XAUTOCLAIM or XCLAIM "
           "finds it idle for that consumer's min-idle-time, counted from its last delivery: "
           "twice does not choose when; use 'do redeliver' (or 'do duplicate') and give the "
           "consumers a min-idle-time of D";
}

#define RESP_MATCHERS_BASE                                                                         \
    [RULE_EV_CONNECT] = CAPS_BIT(RULE_F_CLIENT), [RULE_EV_COMMAND] = CAPS_BIT(RULE_F_COMMAND) |    \
                                                                     CAPS_BIT(RULE_F_KEY) |        \
                                                                     CAPS_BIT(RULE_F_CLIENT)

#define RESP_ACTIONS_BASE                                                                          \
    [RULE_EV_STREAM] = STREAM_ACTIONS,                                                             \
    [RULE_EV_CONNECT] = STREAM_ACTIONS | CAPS_BIT(RULE_ACT_CLOSE) | CAPS_BIT(RULE_ACT_DELAY),      \
    [RULE_EV_COMMAND] = CLOSE_DELAY_DROP | CAPS_BIT(RULE_ACT_ERROR)

#define RESP_BASE_EVENTS                                                                           \
    (CAPS_BIT(RULE_EV_STREAM) | CAPS_BIT(RULE_EV_CONNECT) | CAPS_BIT(RULE_EV_COMMAND))

const struct proto_caps proto_resp_caps = {
    .name = "resp",
    .events = RESP_BASE_EVENTS,
    .matchers = {RESP_MATCHERS_BASE},
    .actions = {RESP_ACTIONS_BASE},
    .why_not = plain_why_not,
};

const struct proto_caps proto_resp_sidekiq_caps = {
    .name = "resp/sidekiq",
    .events = RESP_BASE_EVENTS | CAPS_BIT(RULE_EV_DELIVER) | CAPS_BIT(RULE_EV_PUBLISH),
    .matchers =
        {
            RESP_MATCHERS_BASE,
            [RULE_EV_DELIVER] = JOB_FIELDS | CAPS_BIT(RULE_F_REDELIVERED),
            [RULE_EV_PUBLISH] = JOB_FIELDS,
        },
    .actions =
        {
            RESP_ACTIONS_BASE,
            [RULE_EV_DELIVER] = CLOSE_DELAY_DROP | CAPS_BIT(RULE_ACT_DUPLICATE),
            [RULE_EV_PUBLISH] = CLOSE_DELAY_DROP | CAPS_BIT(RULE_ACT_DUPLICATE),
        },
    .why_not = sidekiq_why_not,
    .late = {[RULE_EV_DELIVER] = CAPS_BIT(RULE_ACT_DUPLICATE)},
};

/* The profiles whose jobs are lists and registries; `lease` only where the framework renews a
 * lease on the wire (RQ's heartbeat, lease_acts 0 elsewhere). */
#define JOB_CAPS(cname, pname, publish_dup, why, late_deliver, late_ack, why_late, lease_acts)     \
    const struct proto_caps cname = {                                                              \
        .name = pname,                                                                             \
        .events = RESP_BASE_EVENTS | CAPS_BIT(RULE_EV_DELIVER) | CAPS_BIT(RULE_EV_PUBLISH) |       \
                  CAPS_BIT(RULE_EV_ACK) | ((lease_acts) != 0 ? CAPS_BIT(RULE_EV_LEASE) : 0),       \
        .matchers =                                                                                \
            {                                                                                      \
                RESP_MATCHERS_BASE,                                                                \
                [RULE_EV_DELIVER] = JOB_FIELDS | CAPS_BIT(RULE_F_REDELIVERED),                     \
                [RULE_EV_PUBLISH] = JOB_FIELDS,                                                    \
                [RULE_EV_ACK] = JOB_FIELDS,                                                        \
                [RULE_EV_LEASE] = (lease_acts) != 0 ? JOB_FIELDS : 0,                              \
            },                                                                                     \
        .actions =                                                                                 \
            {                                                                                      \
                RESP_ACTIONS_BASE,                                                                 \
                [RULE_EV_DELIVER] = CLOSE_DELAY_DROP | CAPS_BIT(RULE_ACT_DUPLICATE),               \
                [RULE_EV_PUBLISH] = CLOSE_DELAY_DROP | (publish_dup),                              \
                [RULE_EV_ACK] = CLOSE_DELAY_DROP | CAPS_BIT(RULE_ACT_REDELIVER),                   \
                [RULE_EV_LEASE] = (lease_acts),                                                    \
            },                                                                                     \
        .why_not = (why),                                                                          \
        .late = {[RULE_EV_DELIVER] = (late_deliver), [RULE_EV_ACK] = (late_ack)},                  \
        .why_not_late = why_late,                                                                  \
    }

static const char *rq_why_not(enum rule_event ev, enum rule_action_kind act)
{
    if (ev == RULE_EV_LEASE && act == RULE_ACT_DUPLICATE)
        return "a heartbeat keeps a job; use 'drop' or 'delay' to let its entry in the started "
               "registry lapse";
    return job_why_not(ev, act);
}

JOB_CAPS(proto_resp_celery_caps, "resp/celery", CAPS_BIT(RULE_ACT_DUPLICATE), job_why_not,
         CAPS_BIT(RULE_ACT_DUPLICATE), 0, celery_why_not_late, 0);
JOB_CAPS(proto_resp_rq_caps, "resp/rq", CAPS_BIT(RULE_ACT_DUPLICATE), rq_why_not,
         CAPS_BIT(RULE_ACT_DUPLICATE), CAPS_BIT(RULE_ACT_REDELIVER), NULL, CLOSE_DELAY_DROP);
JOB_CAPS(proto_resp_streams_caps, "resp/streams", 0, streams_why_not, 0, 0, streams_why_not_late,
         0);
JOB_CAPS(proto_resp_list_caps, "resp/list", CAPS_BIT(RULE_ACT_DUPLICATE), job_why_not,
         CAPS_BIT(RULE_ACT_DUPLICATE), CAPS_BIT(RULE_ACT_REDELIVER), NULL, 0);

static const char *bullmq_why_not(enum rule_event ev, enum rule_action_kind act)
{
    if (ev == RULE_EV_PUBLISH && act == RULE_ACT_DUPLICATE)
        return "a second add is a second job with an id of its own (or, with the app's own "
               "jobId, no job at all: BullMQ ignores an add of an id it has): use 'duplicate' "
               "on 'deliver'";
    if (ev == RULE_EV_LEASE && act == RULE_ACT_DUPLICATE)
        return "a renewal keeps a job; use 'drop' or 'delay' to let its lock lapse";
    return job_why_not(ev, act);
}

/* BullMQ's copies come back when its stalled-job checker finds a lock gone: at its own
 * interval, not at a time twice chooses. */
static const char *bullmq_why_not_late(enum rule_event ev, enum rule_action_kind act)
{
    (void)ev;
    (void)act;
    return "a BullMQ job whose lock lapsed is handed out again by the stalled-job checker, "
           "which runs every stalledInterval (30 s by default): twice does not choose when; "
           "use 'do duplicate' or 'do redeliver' and give the workers the stalledInterval and "
           "lockDuration to test";
}

const struct proto_caps proto_resp_bullmq_caps = {
    .name = "resp/bullmq",
    .events = RESP_BASE_EVENTS | CAPS_BIT(RULE_EV_DELIVER) | CAPS_BIT(RULE_EV_PUBLISH) |
              CAPS_BIT(RULE_EV_ACK) | CAPS_BIT(RULE_EV_LEASE),
    .matchers =
        {
            RESP_MATCHERS_BASE,
            [RULE_EV_DELIVER] = JOB_FIELDS | CAPS_BIT(RULE_F_REDELIVERED),
            [RULE_EV_PUBLISH] = JOB_FIELDS,
            [RULE_EV_ACK] = JOB_FIELDS,
            [RULE_EV_LEASE] = JOB_FIELDS,
        },
    .actions =
        {
            RESP_ACTIONS_BASE,
            [RULE_EV_DELIVER] = CLOSE_DELAY_DROP | CAPS_BIT(RULE_ACT_DUPLICATE),
            [RULE_EV_PUBLISH] = CLOSE_DELAY_DROP,
            [RULE_EV_ACK] = CLOSE_DELAY_DROP | CAPS_BIT(RULE_ACT_REDELIVER),
            [RULE_EV_LEASE] = CLOSE_DELAY_DROP,
        },
    .why_not = bullmq_why_not,
    .why_not_late = bullmq_why_not_late,
};

/* The profiles' tables: a new framework's table is added here, named "resp/" and the profile
 * its module registers (proto/jobs/frameworks.c). */
static const struct proto_caps *const profile_caps[] = {
    &proto_resp_sidekiq_caps, &proto_resp_celery_caps, &proto_resp_rq_caps,
    &proto_resp_streams_caps, &proto_resp_list_caps,   &proto_resp_bullmq_caps,
};

const struct proto_caps *proto_resp_caps_find(const char *profile)
{
    if (profile == NULL)
        return &proto_resp_caps;
    for (size_t i = 0; i < sizeof(profile_caps) / sizeof(profile_caps[0]); i++)
        if (strcmp(profile_caps[i]->name + strlen("resp/"), profile) == 0)
            return profile_caps[i];
    return &proto_resp_caps;
}
