/*
 * frameworks.c - the framework modules, by profile (proto/jobs/framework.h).  A new framework
 * is a module and one line here.
 */
#include "proto/jobs/framework.h"

#include <stddef.h>

extern const struct resp_framework resp_framework_bullmq, resp_framework_celery,
    resp_framework_list, resp_framework_rq, resp_framework_sidekiq, resp_framework_streams;

static const struct resp_framework *const frameworks[] = {
    &resp_framework_sidekiq, &resp_framework_celery, &resp_framework_rq,
    &resp_framework_streams, &resp_framework_list,   &resp_framework_bullmq,
};

size_t resp_framework_count(void)
{
    return sizeof(frameworks) / sizeof(frameworks[0]);
}

const struct resp_framework *resp_framework_at(size_t i)
{
    return i < resp_framework_count() ? frameworks[i] : NULL;
}

const struct resp_framework *resp_framework_of(enum rprof p)
{
    for (size_t i = 0; i < sizeof(frameworks) / sizeof(frameworks[0]); i++)
        if (frameworks[i]->prof == p)
            return frameworks[i];
    return NULL;
}

void resp_framework_free_tag(const struct resp_framework *fw, struct resp_reply_tag *tag)
{
    if (fw != NULL && tag->state != NULL && fw->free_state != NULL)
        fw->free_state(tag->kind, tag->state);
    tag->kind = 0;
    tag->state = NULL;
}
