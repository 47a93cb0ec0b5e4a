/*
 * job.c - the job memory's strings (proto/jobs/job.h).
 */
#include "proto/jobs/job.h"

#include <stdlib.h>
#include <string.h>

void job_memo_set(char **dst, const char *src, size_t len)
{
    free(*dst);
    *dst = NULL;
    if (src == NULL)
        return;
    char *d = malloc(len + 1);
    if (d == NULL)
        return;
    memcpy(d, src, len);
    d[len] = '\0';
    *dst = d;
}
