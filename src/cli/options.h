/*
 * options.h — option parsing shared by the subcommands: how an option and its value are spelled
 * ("--name VALUE" or "--name=VALUE", flags "--name" alone), the engine options of the commands that
 * run a model (--device, --threads, --precision, the cache flags), integer parsing with range
 * checks, and the model directory's first check, so every command spells, checks and reports them
 * the same way.
 */
#ifndef SQUAD_CLI_OPTIONS_H
#define SQUAD_CLI_OPTIONS_H

#include <stdint.h>

#include "squad.h"

/* 1 when arg is the option name ("--threads"), alone or with its value attached ("--threads=4"). */
int cli_is_option(const char *arg, const char *name);

/* The value of the option argv[*i] that cli_is_option matched: the text after its '=', or else the
 * next argument (then *i moves past it). NULL, with "squad CMD: NAME needs a value" on stderr, when
 * there is none (argv[0] is the command's name). */
const char *cli_option_value(int argc, char **argv, int *i);

/* For a flag (an option without a value) that cli_is_option matched: 0 when argv[i] is the flag
 * alone, -1 with "squad CMD: NAME takes no value" on stderr when it came with "=...". */
int cli_flag(char **argv, int i);

/* The model directory's first check, before anything else is loaded from it, so that a missing or
 * wrong directory reads the same in every command (the model loader's own check): 0, or -1 with
 * the message in err. */
int cli_check_model_dir(const char *dir, squad_err *err);

/* Parses a decimal integer in [lo, hi]; 0 on success, -1 (message on stderr) otherwise. */
int cli_parse_int(const char *flag, const char *text, long lo, long hi, long *out);

/* If argv[*i] is an engine option (--device, --threads, --precision, --cache-mb, --stride, --tail,
 * --align, --min-prefix, --max-slots, --max-tokens, --precapture, --max-adapters, --max-rows,
 * --batch-tokens), in either spelling, consumes it (and its value) into opts and returns 1; returns
 * 0 when it is not one; -1 on a missing or bad value (message on stderr). */
int cli_engine_option(int argc, char **argv, int *i, squad_engine_opts *opts);

/* When the engine's longest row is lower than asked because the device's memory could not hold
 * more, says so on stderr (the library never prints); otherwise nothing. */
void cli_log_max_tokens(const char *cmd, const squad_engine *engine, const squad_model *model);

/* The help text of those options. */
extern const char CLI_ENGINE_OPTIONS_HELP[];

/* If argv[*i] is --max-image-pixels N (the largest width x height of an image a request may carry,
 * checked before decoding: docs/images.md), consumes it into *max_pixels and returns 1; 0 when it
 * is not that option; -1 on a missing or bad value (message on stderr). */
int cli_image_option(int argc, char **argv, int *i, int64_t *max_pixels);
extern const char CLI_IMAGE_OPTIONS_HELP[];

#endif
