/*
 * score.c — `squad score`: rows as JSON lines in (a file or stdin), one JSON line out per row, in
 * order (docs/design.md section 9). A bad row gets {"error": "..."} on its line and the rest go on.
 * Exit 0 when every row succeeded, 1 when some failed, 2 for usage or model errors.
 *
 * Rows are read SCORE_BATCH_ROWS at a time and answered together by squad_engine_score_batch
 * (batched steps: rows in flight share each pass over the weights, docs/batching.md); a window's
 * lines are written in input order once it is answered.
 *
 * Images (docs/images.md): a row's "images" are file paths or data: URLs, loaded with
 * squad_image_load; its ids hold one <|image_pad|> per image, which squad_row_expand_images turns
 * into the image's run (moving the slots and state_len after it).
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "answer_json.h"
#include "commands.h"
#include "image/data_url.h"
#include "model.h"
#include "options.h"
#include "rows.h"
#include "squad.h"

/* Rows read before they are answered together: enough to fill the engine's slots many times over,
 * few enough that memory and the first answer's latency stay small. */
#define SCORE_BATCH_ROWS 256

static void score_help(FILE *f) {
    fprintf(f,
            "usage: squad score --model DIR [--rows FILE] [options]\n"
            "\n"
            "Reads rows as JSON lines (FILE, or stdin when --rows is absent or '-'):\n"
            "  {\"ids\": [...], \"slots\": [...], \"nopts\": [...], \"letters\": [...], \"state_len\": n,\n"
            "   \"specialist\": \"label\", \"images\": [\"a.png\", \"data:image/png;base64,...\"]}\n"
            "  (specialist: with --specialists; \"auto\", the default, lets the router decide. images: a model\n"
            "  with a vision tower; ids hold one <|image_pad|> per image, between <|vision_start|> and\n"
            "  <|vision_end|>, which squad expands to the image's tokens: slots and state_len count the\n"
            "  ids as given)\n"
            "and writes one JSON line per row, in order:\n"
            "  {\"probs\": [[...], ...], \"reused\": R, \"computed\": C}   (with --specialists also \"route\": \"label\")\n"
            "or {\"error\": \"...\"} for a bad row (the rest still run). Blank lines are skipped.\n"
            "Rows are answered %d at a time in batched steps (--max-rows, --batch-tokens).\n"
            "Exit status: 0 every row answered, 1 some rows failed, 2 usage or model error.\n"
            "\n"
            "options:\n"
            "  --model DIR              a Hugging Face Qwen3.5 model directory (config.json + safetensors)\n"
            "  --rows FILE              the rows (default: stdin)\n"
            "  --specialists DIR        a specialists directory (docs/specialists.md): a router picks each row's\n"
            "                           LoRA adapter for the upper layers\n"
            "  --stats                  print the cache statistics as JSON on stderr at the end\n"
            "%s",
            SCORE_BATCH_ROWS, CLI_ENGINE_OPTIONS_HELP);
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
            "\"mispredictions\": %llu, \"image_rows\": %llu, \"image_tokens\": %llu, \"encoder_hits\": %llu, "
            "\"encoder_misses\": %llu, \"encoder_bytes\": %zu, \"encoder_budget_bytes\": %zu}\n",
            (unsigned long long)st.rows, (unsigned long long)st.hits, (unsigned long long)st.partial,
            (unsigned long long)st.cold, (unsigned long long)st.plain, (unsigned long long)st.memo_hits,
            (unsigned long long)st.tokens_memo, (unsigned long long)st.uncacheable,
            (unsigned long long)st.tokens_reused, (unsigned long long)st.tokens_computed,
            (unsigned long long)st.checkpoints_made, (unsigned long long)st.evicted,
            (unsigned long long)st.checkpoints, (unsigned long long)st.groups, st.bytes_held, st.budget_bytes,
            (unsigned long long)st.mispredictions, (unsigned long long)st.image_rows,
            (unsigned long long)st.image_tokens, (unsigned long long)st.encoder_hits,
            (unsigned long long)st.encoder_misses, st.encoder_bytes, st.encoder_budget_bytes);
}

static int is_blank(const char *s) {
    for (; *s; s++)
        if (!isspace((unsigned char)*s)) return 0;
    return 1;
}

/* One window of input lines: each parsed into a row, or its error. */
typedef struct score_window {
    int n;
    squad_row_buf rb[SCORE_BATCH_ROWS];
    int parsed[SCORE_BATCH_ROWS]; /* 1: rb holds the row */
    squad_row rows[SCORE_BATCH_ROWS];
    int index[SCORE_BATCH_ROWS]; /* rows[k] is line index[k] of the window */
    squad_result res[SCORE_BATCH_ROWS];
    int rcs[SCORE_BATCH_ROWS];
    squad_err errs[SCORE_BATCH_ROWS]; /* per line: a parse error, or the row's */
    squad_row_image images[SCORE_BATCH_ROWS][SQUAD_MAX_IMAGES_PER_ROW]; /* per line, loaded */
} score_window;

/* The bytes of one "images" entry: a data: URL, or a file. */
static uint8_t *image_bytes(const char *ref, size_t *len, squad_err *err) {
    uint8_t *bytes = NULL;
    if (!strncmp(ref, "data:", 5) || strstr(ref, "://")) { /* a URL: only data: ones are read */
        return squad_image_text_bytes(ref, strlen(ref), &bytes, len, err) ? NULL : bytes;
    }
    return (uint8_t *)squad_read_file(ref, len, err);
}

/* Loads the row's images and expands its one <|image_pad|> per image; the error names the image. */
static int row_images(score_window *w, int i, const squad_model *model, squad_err *err) {
    squad_row_buf *rb = &w->rb[i];
    for (int k = 0; k < rb->n_image_refs; k++) {
        size_t len = 0;
        uint8_t *bytes = image_bytes(rb->image_refs[k], &len, err);
        int rc = bytes ? squad_image_load(model, bytes, len, 0, &w->images[i][k], err) : err->code;
        free(bytes);
        if (rc) {
            for (int j = 0; j < k; j++) squad_row_image_free(&w->images[i][j]);
            squad_fail_context(err, "images[%d] %.100s: ", k, rb->image_refs[k]);
            return rc;
        }
    }
    int rc = squad_row_expand_images(rb, model->cfg.image_token_id, w->images[i], rb->n_image_refs,
                                     squad_model_max_tokens(model), err);
    if (rc)
        for (int k = 0; k < rb->n_image_refs; k++) squad_row_image_free(&w->images[i][k]);
    return rc;
}

/* The line's images back (after its answer). */
static void row_images_free(score_window *w, int i) {
    for (int k = 0; k < w->rb[i].n_image_refs; k++) squad_row_image_free(&w->images[i][k]);
}

/* Parses one line into the window's next entry (its error kept when it is bad). */
static void window_add(score_window *w, const char *line, size_t len, const squad_model *model,
                       const squad_specialists *sp) {
    const int i = w->n++;
    squad_err *err = &w->errs[i];
    memset(err, 0, sizeof *err);
    int rc = squad_row_parse_json(&w->rb[i], line, len, NULL, 0, err);
    if (!rc && w->rb[i].specialist) { /* a label to its route (+ 1: squad_row.specialist) */
        const int route = squad_specialists_find(sp, w->rb[i].specialist);
        if (route < 0) {
            snprintf(err->msg, sizeof err->msg,
                     sp ? "unknown specialist '%.100s'" : "\"specialist\" '%.100s' needs --specialists",
                     w->rb[i].specialist);
            rc = SQUAD_E_INVALID;
            squad_row_buf_free(&w->rb[i]);
        }
        if (!rc) w->rb[i].row.specialist = route + 1;
    }
    if (!rc && w->rb[i].n_image_refs > 0 && (rc = row_images(w, i, model, err))) squad_row_buf_free(&w->rb[i]);
    w->parsed[i] = !rc;
}

/* Answers the window's rows in one batch and writes every line in order; 1 when some line failed. */
static int window_flush(score_window *w, squad_engine *engine, const squad_specialists *sp) {
    int n_rows = 0, failed = 0;
    for (int i = 0; i < w->n; i++)
        if (w->parsed[i]) {
            w->rows[n_rows] = w->rb[i].row;
            w->index[n_rows++] = i;
        }
    squad_err err = {0};
    squad_err *row_errs = malloc(sizeof(squad_err) * (size_t)(n_rows > 0 ? n_rows : 1));
    if (!row_errs) {
        fprintf(stderr, "squad score: out of memory\n");
        return 1;
    }
    squad_engine_score_batch(engine, w->rows, n_rows, NULL, w->res, w->rcs, row_errs, &err);
    for (int k = 0; k < n_rows; k++) w->errs[w->index[k]] = row_errs[k];
    free(row_errs);
    for (int i = 0, k = 0; i < w->n; i++) {
        const int ok = w->parsed[i] && w->rcs[k] == 0;
        if (ok) print_line(&w->rb[i].row, &w->res[k], sp, NULL);
        else print_line(NULL, NULL, NULL, w->errs[i].msg);
        failed |= !ok;
        if (w->parsed[i]) {
            row_images_free(w, i);
            squad_row_buf_free(&w->rb[i]);
            k++;
        }
    }
    fflush(stdout);
    w->n = 0;
    return failed;
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
        const char **dst = cli_is_option(a, "--model")         ? &model_dir
                           : cli_is_option(a, "--rows")        ? &rows_path
                           : cli_is_option(a, "--specialists") ? &spec_dir
                                                               : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            score_help(stdout);
            return 0;
        } else if (dst) {
            if (!(*dst = cli_option_value(argc, argv, &i))) return 2;
        } else if (cli_is_option(a, "--stats")) {
            if (cli_flag(argv, i)) return 2;
            stats = 1;
        } else {
            fprintf(stderr, "squad score: unknown option '%s' (see squad score --help)\n", a);
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
    score_window *w = calloc(1, sizeof *w);
    if (!w) {
        fprintf(stderr, "squad score: out of memory\n");
        failed = -1;
    }
    while (w && (n = getline(&line, &cap, in)) >= 0) {
        if (is_blank(line)) continue;
        window_add(w, line, (size_t)n, model, sp);
        if (w->n == SCORE_BATCH_ROWS) failed |= window_flush(w, engine, sp);
    }
    if (w && w->n) failed |= window_flush(w, engine, sp);
    free(line);
    free(w);
    if (stats) print_stats(engine);
    squad_engine_free(engine);
    squad_specialists_free(sp);
    squad_model_free(model);
    if (in != stdin) fclose(in);
    return failed < 0 ? 2 : failed;
}
