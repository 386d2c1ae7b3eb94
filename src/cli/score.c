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

#include "commands.h"
#include "options.h"
#include "rows.h"
#include "squad.h"

static void score_help(FILE *f) {
    fprintf(f,
            "usage: squad score --model DIR [--rows FILE] [options]\n"
            "\n"
            "Reads rows as JSON lines (FILE, or stdin when --rows is absent or '-'):\n"
            "  {\"ids\": [...], \"slots\": [...], \"nopts\": [...], \"letters\": [...], \"state_len\": n}\n"
            "and writes one JSON line per row, in order:\n"
            "  {\"probs\": [[...], ...], \"reused\": R, \"computed\": C}\n"
            "or {\"error\": \"...\"} for a bad row (the rest still run). Blank lines are skipped.\n"
            "Exit status: 0 every row answered, 1 some rows failed, 2 usage or model error.\n"
            "\n"
            "options:\n"
            "  --model DIR              a Hugging Face Qwen3.5 model directory (config.json + safetensors)\n"
            "  --rows FILE              the rows (default: stdin)\n"
            "  --specialists DIR        specialists (not implemented in this version: refused)\n"
            "  --stats                  print the cache statistics as JSON on stderr at the end\n"
            "%s",
            CLI_ENGINE_OPTIONS_HELP);
}

static void print_error_line(const char *msg) {
    json_t *o = json_pack("{s:s}", "error", msg);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "{\"error\": \"out of memory\"}");
    free(s);
    json_decref(o);
}

static void print_result(const squad_row *row, const squad_result *r) {
    fputs("{\"probs\": [", stdout);
    for (int s = 0; s < r->n_slots; s++) {
        fputs(s ? ", [" : "[", stdout);
        for (int l = 0; l < row->nopts[s]; l++) printf(l ? ", %.9g" : "%.9g", r->probs[s][l]);
        fputc(']', stdout);
    }
    printf("], \"reused\": %d, \"computed\": %d}\n", r->reused, r->computed);
}

static void print_stats(const squad_engine *e) {
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    fprintf(stderr,
            "{\"rows\": %llu, \"hits\": %llu, \"partial\": %llu, \"cold\": %llu, \"plain\": %llu, "
            "\"memo_hits\": %llu, \"tokens_memo\": %llu, \"uncacheable\": %llu, "
            "\"tokens_reused\": %llu, \"tokens_computed\": %llu, \"checkpoints_made\": %llu, \"evicted\": %llu, "
            "\"checkpoints\": %llu, \"groups\": %llu, \"bytes_held\": %zu, \"budget_bytes\": %zu}\n",
            (unsigned long long)st.rows, (unsigned long long)st.hits, (unsigned long long)st.partial,
            (unsigned long long)st.cold, (unsigned long long)st.plain, (unsigned long long)st.memo_hits,
            (unsigned long long)st.tokens_memo, (unsigned long long)st.uncacheable,
            (unsigned long long)st.tokens_reused, (unsigned long long)st.tokens_computed,
            (unsigned long long)st.checkpoints_made, (unsigned long long)st.evicted,
            (unsigned long long)st.checkpoints, (unsigned long long)st.groups, st.bytes_held, st.budget_bytes);
}

static int is_blank(const char *s) {
    for (; *s; s++)
        if (!isspace((unsigned char)*s)) return 0;
    return 1;
}

int cmd_score(int argc, char **argv) {
    const char *model_dir = NULL, *rows_path = NULL;
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
        } else if (!strcmp(a, "--specialists")) {
            fprintf(stderr, "squad score: --specialists is not implemented in this version of squad\n");
            return 2;
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
    squad_engine *engine = squad_engine_new(model, &opts, &err);
    if (!engine) {
        fprintf(stderr, "squad score: %s\n", err.msg);
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
        if (!rc) {
            rc = squad_engine_score(engine, &rb.row, res, &err);
            if (!rc) print_result(&rb.row, res);
            squad_row_buf_free(&rb);
        }
        if (rc) {
            print_error_line(err.msg);
            failed = 1;
        }
        fflush(stdout);
    }
    free(line);
    free(res);
    if (stats) print_stats(engine);
    squad_engine_free(engine);
    squad_model_free(model);
    if (in != stdin) fclose(in);
    return failed < 0 ? 2 : failed;
}
