/*
 * score.c — `squad score`: rows as JSON lines in (a file or stdin), one JSON line out per row, in
 * order (docs/design.md section 9). A bad row gets {"error": "..."} on its line and the rest go on.
 * Exit 0 when every row succeeded, 1 when some failed, 2 for usage or model errors.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "answer_json.h"
#include "commands.h"
#include "options.h"
#include "rows.h"
#include "squad.h"

static void score_help(FILE *f) {
    fprintf(f,
            "usage: squad score --model DIR [--rows FILE] [options]\n"
            "\n"
            "Reads rows as JSON lines (FILE, or stdin when --rows is absent or '-'):\n"
            "  {\"ids\": [...], \"slots\": [...], \"nopts\": [...], \"letters\": [...], \"state_len\": n,\n"
            "   \"specialist\": \"label\"}          (specialist: with --specialists; \"auto\", the default, lets\n"
            "                                    the router decide)\n"
            "and writes one JSON line per row, in order:\n"
            "  {\"probs\": [[...], ...], \"reused\": R, \"computed\": C}   (with --specialists also \"route\": \"label\")\n"
            "or {\"error\": \"...\"} for a bad row (the rest still run). Blank lines are skipped.\n"
            "Exit status: 0 every row answered, 1 some rows failed, 2 usage or model error.\n"
            "\n"
            "options:\n"
            "  --model DIR              a Hugging Face Qwen3.5 model directory (config.json + safetensors)\n"
            "  --rows FILE              the rows (default: stdin)\n"
            "  --specialists DIR        a specialists directory (docs/specialists.md): a router picks each row's\n"
            "                           LoRA adapter for the upper layers\n"
            "  --stats                  print the cache statistics as JSON on stderr at the end\n"
            "%s",
            CLI_ENGINE_OPTIONS_HELP);
}

/* One output line: the row's answer or its error (answer_json.h: the server writes the same). */
static void print_line(const squad_row *row, const squad_result *r, const squad_specialists *sp, const char *error) {
    squad_buf b = {0};
    if (error) squad_score_error_json(&b, error);
    else squad_score_result_json(&b, row, r, sp);
    squad_buf_puts(&b, "\n");
    char *text = squad_buf_take(&b, NULL);
    fputs(text ? text : "{\"error\": \"out of memory\"}\n", stdout);
    free(text);
}

static void print_stats(const squad_engine *e) {
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    fprintf(stderr,
            "{\"rows\": %llu, \"hits\": %llu, \"partial\": %llu, \"cold\": %llu, \"plain\": %llu, "
            "\"memo_hits\": %llu, \"tokens_memo\": %llu, \"uncacheable\": %llu, "
            "\"tokens_reused\": %llu, \"tokens_computed\": %llu, \"checkpoints_made\": %llu, \"evicted\": %llu, "
            "\"checkpoints\": %llu, \"groups\": %llu, \"bytes_held\": %zu, \"budget_bytes\": %zu, "
            "\"mispredictions\": %llu}\n",
            (unsigned long long)st.rows, (unsigned long long)st.hits, (unsigned long long)st.partial,
            (unsigned long long)st.cold, (unsigned long long)st.plain, (unsigned long long)st.memo_hits,
            (unsigned long long)st.tokens_memo, (unsigned long long)st.uncacheable,
            (unsigned long long)st.tokens_reused, (unsigned long long)st.tokens_computed,
            (unsigned long long)st.checkpoints_made, (unsigned long long)st.evicted,
            (unsigned long long)st.checkpoints, (unsigned long long)st.groups, st.bytes_held, st.budget_bytes,
            (unsigned long long)st.mispredictions);
}

static int is_blank(const char *s) {
    for (; *s; s++)
        if (!isspace((unsigned char)*s)) return 0;
    return 1;
}

int cmd_score(int argc, char **argv) {
    const char *model_dir = NULL, *rows_path = NULL, *spec_dir = NULL;
    int stats = 0;
    squad_engine_opts opts;
    squad_engine_opts_default(&opts);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_engine_option(argc, argv, &i, &opts);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            score_help(stdout);
            return 0;
        } else if (!strcmp(a, "--model") && i + 1 < argc) {
            model_dir = argv[++i];
        } else if (!strcmp(a, "--rows") && i + 1 < argc) {
            rows_path = argv[++i];
        } else if (!strcmp(a, "--stats")) {
            stats = 1;
        } else if (!strcmp(a, "--specialists") && i + 1 < argc) {
            spec_dir = argv[++i];
        } else {
            fprintf(stderr, "squad score: unknown or incomplete option '%s' (see squad score --help)\n", a);
            return 2;
        }
    }
    if (!model_dir) {
        fprintf(stderr, "squad score: --model DIR is required (see squad score --help)\n");
        return 2;
    }
    FILE *in = stdin;
    if (rows_path && strcmp(rows_path, "-")) {
        in = fopen(rows_path, "rb");
        if (!in) {
            perror(rows_path);
            return 2;
        }
    }
    squad_err err = {0};
    squad_model *model = squad_model_load(model_dir, &err);
    if (!model) {
        fprintf(stderr, "squad score: %s\n", err.msg);
        if (in != stdin) fclose(in);
        return 2;
    }
    squad_specialists *sp = NULL;
    if (spec_dir && !(sp = squad_specialists_load(model, spec_dir, &err))) {
        fprintf(stderr, "squad score: %s\n", err.msg);
        squad_model_free(model);
        if (in != stdin) fclose(in);
        return 2;
    }
    opts.specialists = sp;
    squad_engine *engine = squad_engine_new(model, &opts, &err);
    if (!engine) {
        fprintf(stderr, "squad score: %s\n", err.msg);
        squad_specialists_free(sp);
        squad_model_free(model);
        if (in != stdin) fclose(in);
        return 2;
    }
    cli_log_max_tokens("score", engine, model);
    int failed = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    squad_result *res = malloc(sizeof *res);
    if (!res) {
        fprintf(stderr, "squad score: out of memory\n");
        failed = -1;
    }
    while (res && (n = getline(&line, &cap, in)) >= 0) {
        if (is_blank(line)) continue;
        squad_row_buf rb;
        err.code = 0;
        int rc = squad_row_parse_json(&rb, line, (size_t)n, NULL, 0, &err);
        if (!rc && rb.specialist) { /* a label to its route (+ 1: squad_row.specialist) */
            const int route = squad_specialists_find(sp, rb.specialist);
            if (route < 0) {
                snprintf(err.msg, sizeof err.msg, sp ? "unknown specialist '%.100s'" : "\"specialist\" '%.100s' needs --specialists",
                         rb.specialist);
                rc = SQUAD_E_INVALID;
                squad_row_buf_free(&rb);
            }
            if (!rc) rb.row.specialist = route + 1;
        }
        if (!rc) {
            rc = squad_engine_score(engine, &rb.row, res, &err);
            if (!rc) print_line(&rb.row, res, sp, NULL);
            squad_row_buf_free(&rb);
        }
        if (rc) {
            print_line(NULL, NULL, NULL, err.msg);
            failed = 1;
        }
        fflush(stdout);
    }
    free(line);
    free(res);
    if (stats) print_stats(engine);
    squad_engine_free(engine);
    squad_specialists_free(sp);
    squad_model_free(model);
    if (in != stdin) fclose(in);
    return failed < 0 ? 2 : failed;
}
