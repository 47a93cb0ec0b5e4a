/*
 * cli.h - the one way every `twice` command takes its file.
 *
 * Each command reads one file: `run` and `check` a configuration, `report`
 * and `verdict` a journal.  The file is the command's first argument that is
 * not an option (`twice run twice.conf`, `twice report run.pb`), or the value
 * of the command's flag (`-c FILE` / `--config FILE` for run and check,
 * `--journal FILE` for report and verdict, each also as `--flag=FILE`).  Two
 * different files are a usage error, not the last one winning.
 */
#ifndef TWICE_CLI_H
#define TWICE_CLI_H

#include <stdio.h>

/*
 * Takes argv[*i] if it names the command's file: a positional argument, or
 * one of `flags` (a NULL-terminated list such as {"-c", "--config", NULL})
 * with its value, as the next argument or after '='.  Returns 1 when taken
 * (*file points into argv; *i is advanced past a flag's value), 0 when
 * argv[*i] is something else (an option of the command's own), or -1 after
 * writing why to err: a flag without its value, or a second, different file.
 * `what` names the file in messages ("journal"); argv[0] is the command.
 */
int cli_file_arg(int argc, char **argv, int *i, const char *const *flags, const char *what,
                 const char **file, FILE *err);

/*
 * The output format of report and verdict: `value` ("text", "markdown" or "json", from
 * `--format` or `--json`) into *format.  Given twice, the two must agree: neither is dropped
 * silently.  Returns 1, or -1 after writing why to err (`cmd` names the command).
 */
int cli_format_set(const char **format, const char *value, const char *cmd, FILE *err);

#endif
