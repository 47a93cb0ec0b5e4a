/*
 * cli.c - a command's file as its positional argument or its flag.  See cli.h.
 */
#include "offline/cli.h"

#include <string.h>

/* The one of `flags` that `arg` is, alone (value in the next argument: *value
 * NULL) or as `flag=VALUE` (*value set); NULL when none. */
static const char *which_flag(const char *arg, const char *const *flags, const char **value)
{
    for (const char *const *f = flags; *f != NULL; f++) {
        size_t n = strlen(*f);
        if (strncmp(arg, *f, n) != 0)
            continue;
        if (arg[n] == '\0') {
            *value = NULL;
            return *f;
        }
        if (arg[n] == '=') {
            *value = arg + n + 1;
            return *f;
        }
    }
    return NULL;
}

/* Stores `name` as the file, unless another one was given already. */
static int set_file(const char **file, const char *name, const char *cmd, const char *what,
                    FILE *err)
{
    if (*file != NULL && strcmp(*file, name) != 0) {
        fprintf(err, "twice %s: more than one %s given: '%s' and '%s'\n", cmd, what, *file, name);
        return -1;
    }
    *file = name;
    return 1;
}

int cli_format_set(const char **format, const char *value, const char *cmd, FILE *err)
{
    if (strcmp(value, "text") != 0 && strcmp(value, "markdown") != 0 &&
        strcmp(value, "json") != 0) {
        fprintf(err, "twice %s: --format '%s': expected text, markdown or json\n", cmd, value);
        return -1;
    }
    if (*format != NULL && strcmp(*format, value) != 0) {
        fprintf(err, "twice %s: two output formats given: %s and %s (--json is --format json)\n",
                cmd, *format, value);
        return -1;
    }
    *format = value;
    return 1;
}

int cli_file_arg(int argc, char **argv, int *i, const char *const *flags, const char *what,
                 const char **file, FILE *err)
{
    const char *arg = argv[*i], *value = NULL;
    /* "-" alone is a name (stdin's, by convention), not an option */
    if (arg[0] != '-' || arg[1] == '\0')
        return set_file(file, arg, argv[0], what, err);
    const char *flag = which_flag(arg, flags, &value);
    if (flag == NULL)
        return 0;
    if (value == NULL && *i + 1 < argc)
        value = argv[++*i];
    if (value == NULL || value[0] == '\0') {
        fprintf(err, "twice %s: %s needs a value\n", argv[0], flag);
        return -1;
    }
    return set_file(file, value, argv[0], what, err);
}
