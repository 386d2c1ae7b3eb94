/*
 * options.h — option parsing shared by the subcommands that run a model (score, ask, bench):
 * the engine options (--device, --threads, --precision, the cache flags) and integer parsing with
 * range checks, so every command spells and checks them the same way.
 */
#ifndef SQUAD_CLI_OPTIONS_H
#define SQUAD_CLI_OPTIONS_H

#include "squad.h"

/* Parses a decimal integer in [lo, hi]; 0 on success, -1 (message on stderr) otherwise. */
int cli_parse_int(const char *flag, const char *text, long lo, long hi, long *out);

/* If argv[*i] is an engine option (--device, --threads, --precision, --cache-mb, --stride, --tail,
 * --align, --min-prefix, --max-slots, --max-tokens, --precapture, --max-adapters, --max-rows,
 * --batch-tokens), consumes it (and its value) into opts and returns 1; returns 0 when it is not one; -1 on a bad value (message on stderr). */
int cli_engine_option(int argc, char **argv, int *i, squad_engine_opts *opts);

/* When the engine's longest row is lower than asked because the device's memory could not hold
 * more, says so on stderr (the library never prints); otherwise nothing. */
void cli_log_max_tokens(const char *cmd, const squad_engine *engine, const squad_model *model);

/* The help text of those options. */
extern const char CLI_ENGINE_OPTIONS_HELP[];

#endif
