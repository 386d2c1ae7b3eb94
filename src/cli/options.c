/*
 * options.c — option spelling, the engine options every model-running subcommand accepts, and the
 * model directory's first check (see options.h). Options follow the GNU convention: a value may be
 * the next argument or attached with '=' ("--threads 4" and "--threads=4" are the same); only the
 * first '=' separates, so a value may contain more.
 */
#include "options.h"

#include "image/decode.h"
#include "model.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char CLI_ENGINE_OPTIONS_HELP[] =
    "  --device cpu|cuda|cuda:N|auto  compute device (default auto: CUDA when a GPU is present);\n"
    "                           cuda:N runs on GPU N (cuda is cuda:0): one process per GPU\n"
    "  --threads N              CPU threads (default: all cores)\n"
    "  --precision bf16|exact   bf16 (default): bf16 activations, the fast path (CPU: bf16 dot-product\n"
    "                           GEMMs; CUDA: tensor cores), ~1e-3 relative error; exact: fp32 arithmetic,\n"
    "                           equal to an fp32 forward of the model (the reference path for checks)\n"
    "  --cache-mb N             state-cache budget in MB (default 1024; 0 turns the cache and memo off)\n"
    "  --cache-host-mb N        CUDA: host-RAM tier under the state cache, in MB: checkpoints evicted\n"
    "                           from --cache-mb move to pinned host memory (pinned at start) and come\n"
    "                           back on a hit (serve: sized from the machine, twice the device budget\n"
    "                           within 1/8 of the RAM; other commands: 0 = off). Off on the CPU\n"
    "  --stride N               a checkpoint at every multiple of N tokens (default 2048)\n"
    "  --tail N                 a checkpoint N tokens before the state's end (default 16)\n"
    "  --align N                checkpoint positions are multiples of N (default 64)\n"
    "  --min-prefix N           states shorter than N tokens are not cached (default 256)\n"
    "  --max-slots N            rows with more slots are not cached (default 4)\n"
    "  --precapture             CUDA: capture every chunk graph at start\n"
    "  --max-adapters N         with --specialists: adapters resident at once, the rest loaded on\n"
    "                           demand, least recently used out first (default 0: all)\n"
    "  --max-tokens N           the longest row (default 0: the model's max_position_embeddings),\n"
    "                           lowered when the device cannot hold its K / V; memory follows the rows\n"
    "  --max-rows N             rows in flight at once, batched together, each in its own sequence\n"
    "                           slot (default 0: the backend's slots; 1: one row at a time)\n"
    "  --batch-tokens N         tokens one batched step runs, all its rows' chunks together (default 0:\n"
    "                           the backend's largest batch); a long row is cut to what the short ones\n"
    "                           leave (docs/batching.md)\n";

int cli_is_option(const char *arg, const char *name) {
    const size_t n = strlen(name);
    return !strncmp(arg, name, n) && (arg[n] == 0 || arg[n] == '=');
}

const char *cli_option_value(int argc, char **argv, int *i) {
    const char *eq = strchr(argv[*i], '=');
    if (eq) return eq + 1;
    if (*i + 1 < argc) return argv[++*i];
    fprintf(stderr, "squad %s: %s needs a value (see squad %s --help)\n", argv[0], argv[*i], argv[0]);
    return NULL;
}

int cli_flag(char **argv, int i) {
    const char *eq = strchr(argv[i], '=');
    if (!eq) return 0;
    fprintf(stderr, "squad %s: %.*s takes no value (got '%s')\n", argv[0], (int)(eq - argv[i]), argv[i], argv[i]);
    return -1;
}

int cli_check_model_dir(const char *dir, squad_err *err) {
    return squad_model_dir_check(dir, err) ? -1 : 0;
}

int cli_parse_int(const char *flag, const char *text, long lo, long hi, long *out) {
    if (!text) {
        fprintf(stderr, "squad: %s needs a value\n", flag);
        return -1;
    }
    errno = 0;
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "squad: %s must be an integer in %ld..%ld (got '%s')\n", flag, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

/* The engine options that take a value; --precapture is the one flag. */
static const char *const ENGINE_VALUE_OPTIONS[] = {
    "--device",   "--precision",  "--threads",   "--cache-mb", "--stride",   "--tail",         "--align",
    "--min-prefix", "--cache-host-mb", "--max-adapters", "--max-tokens", "--max-rows", "--batch-tokens", "--max-slots",
};

/* Applies the engine option name with its value: 0, or -1 (message on stderr). */
static int apply_engine_option(const char *name, const char *val, squad_engine_opts *o) {
    long v;
    if (!strcmp(name, "--device")) {
        if (!strcmp(val, "cpu")) o->device = SQUAD_DEVICE_CPU;
        else if (!strcmp(val, "cuda")) o->device = SQUAD_DEVICE_CUDA;
        else if (!strcmp(val, "auto")) o->device = SQUAD_DEVICE_AUTO;
        else if (!strncmp(val, "cuda:", 5)) {
            if (cli_parse_int("--device cuda:N", val + 5, 0, SQUAD_MAX_DEVICE_INDEX, &v)) return -1;
            o->device = SQUAD_DEVICE_CUDA;
            o->device_index = (int)v;
        } else {
            fprintf(stderr, "squad: --device must be cpu, cuda or auto (got '%s'); cuda:N is GPU N\n", val);
            return -1;
        }
    } else if (!strcmp(name, "--precision")) {
        if (!strcmp(val, "exact")) o->precision = SQUAD_PRECISION_EXACT;
        else if (!strcmp(val, "bf16")) o->precision = SQUAD_PRECISION_BF16;
        else {
            fprintf(stderr, "squad: --precision must be exact or bf16 (got '%s')\n", val);
            return -1;
        }
    } else if (!strcmp(name, "--threads")) {
        if (cli_parse_int(name, val, 0, 1024, &v)) return -1;
        o->threads = (int)v;
    } else if (!strcmp(name, "--cache-mb")) {
        if (cli_parse_int(name, val, 0, 1L << 30, &v)) return -1;
        o->cache.budget_bytes = (size_t)v << 20;
    } else if (!strcmp(name, "--cache-host-mb")) {
        if (cli_parse_int(name, val, 0, 1L << 30, &v)) return -1;
        o->cache.host_budget_bytes = (size_t)v << 20;
    } else if (!strcmp(name, "--stride")) {
        if (cli_parse_int(name, val, 0, 1L << 24, &v)) return -1;
        o->cache.stride = (int)v;
    } else if (!strcmp(name, "--tail")) {
        if (cli_parse_int(name, val, 0, 1L << 24, &v)) return -1;
        o->cache.tail = (int)v;
    } else if (!strcmp(name, "--align")) {
        if (cli_parse_int(name, val, 1, 1L << 16, &v)) return -1;
        o->cache.align = (int)v;
    } else if (!strcmp(name, "--min-prefix")) {
        if (cli_parse_int(name, val, 0, 1L << 24, &v)) return -1;
        o->cache.min_prefix = (int)v;
    } else if (!strcmp(name, "--max-adapters")) {
        if (cli_parse_int(name, val, 0, SQUAD_MAX_ROUTES, &v)) return -1;
        o->max_adapters = (int)v;
    } else if (!strcmp(name, "--max-tokens")) {
        if (cli_parse_int(name, val, 0, INT32_MAX, &v)) return -1;
        o->max_tokens = (int)v;
    } else if (!strcmp(name, "--max-rows")) {
        if (cli_parse_int(name, val, 0, 1L << 16, &v)) return -1;
        o->max_rows = (int)v;
    } else if (!strcmp(name, "--batch-tokens")) {
        if (cli_parse_int(name, val, 0, INT32_MAX, &v)) return -1;
        o->batch_tokens = (int)v;
    } else { /* --max-slots */
        if (cli_parse_int(name, val, 1, SQUAD_MAX_SLOTS_PER_ROW, &v)) return -1;
        o->cache.max_slots = (int)v;
    }
    return 0;
}

int cli_engine_option(int argc, char **argv, int *i, squad_engine_opts *o) {
    const char *a = argv[*i];
    if (cli_is_option(a, "--precapture")) {
        if (cli_flag(argv, *i)) return -1;
        o->precapture = 1;
        return 1;
    }
    for (size_t k = 0; k < sizeof ENGINE_VALUE_OPTIONS / sizeof ENGINE_VALUE_OPTIONS[0]; k++) {
        if (!cli_is_option(a, ENGINE_VALUE_OPTIONS[k])) continue;
        const char *val = cli_option_value(argc, argv, i);
        if (!val) return -1;
        return apply_engine_option(ENGINE_VALUE_OPTIONS[k], val, o) ? -1 : 1;
    }
    return 0;
}

void cli_log_max_tokens(const char *cmd, const squad_engine *e, const squad_model *m) {
    squad_limit why;
    const int n = squad_engine_max_tokens(e, &why);
    if (why == SQUAD_LIMIT_MEMORY)
        fprintf(stderr, "squad %s: rows up to %d tokens: bounded by memory, not the model (%d positions)\n", cmd, n,
                squad_model_max_tokens(m));
}

const char CLI_IMAGE_OPTIONS_HELP[] =
    "  --max-image-pixels N     the largest image a request may carry, as width x height, checked\n"
    "                           before decoding (default 33554432, 32 Mi pixels)\n";

int cli_image_option(int argc, char **argv, int *i, int64_t *max_pixels) {
    if (!cli_is_option(argv[*i], "--max-image-pixels")) return 0;
    const char *val = cli_option_value(argc, argv, i);
    long v;
    if (!val || cli_parse_int("--max-image-pixels", val, 1, (long)SQUAD_IMAGE_MAX_SIDE * SQUAD_IMAGE_MAX_SIDE, &v))
        return -1;
    *max_pixels = v;
    return 1;
}
