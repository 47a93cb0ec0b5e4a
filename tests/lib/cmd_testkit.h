/*
 * cmd_testkit.h - what the tests of the journal commands (`twice report`, `twice verdict`)
 * share: a scratch folder with a journal and an effects file, a command run with its output
 * captured, and the checks on that output.  Header-only: each test is its own executable;
 * include it after <cmocka.h>.
 */
#ifndef TWICE_CMD_TESTKIT_H
#define TWICE_CMD_TESTKIT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offline/verdict.h"

struct fixture {
    char dir[64];
    char journal[128];
    char effects[128];
    char *out, *err; /* captured by run() */
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/twice-cmdtest-XXXXXX");
    if (mkdtemp(f->dir) == NULL) {
        free(f);
        return -1;
    }
    snprintf(f->journal, sizeof(f->journal), "%s/run.journal", f->dir);
    snprintf(f->effects, sizeof(f->effects), "%s/effects.txt", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    unlink(f->journal);
    unlink(f->effects);
    rmdir(f->dir);
    free(f->out);
    free(f->err);
    free(f);
    return 0;
}

static inline void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

typedef int (*command_fn)(int argc, char **argv, FILE *out, FILE *err);

/* Runs a command with its output captured into f->out and f->err. */
static int run(struct fixture *f, command_fn fn, int argc, const char **argv)
{
    free(f->out);
    free(f->err);
    size_t olen = 0, elen = 0;
    FILE *out = open_memstream(&f->out, &olen);
    FILE *err = open_memstream(&f->err, &elen);
    int rc = fn(argc, (char **)argv, out, err);
    fclose(out);
    fclose(err);
    return rc;
}

static void assert_contains(const char *haystack, const char *needle)
{
    if (strstr(haystack, needle) == NULL)
        fail_msg("expected to find\n  %s\nin\n%s", needle, haystack);
}

/* The verdict's row of task, which must be there. */
static inline const struct verdict_task *row(const struct verdict_result *res, const char *task)
{
    for (size_t i = 0; i < res->n_tasks; i++) {
        if (strcmp(res->tasks[i].task, task) == 0)
            return &res->tasks[i];
    }
    fail_msg("no row for task %s", task);
    return NULL;
}

#endif
