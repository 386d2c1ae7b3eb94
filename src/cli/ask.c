/*
 * ask.c — `squad ask`: a text request (a state and multiple-choice questions) answered end to end.
 *
 * The request becomes rows through the prompt template (src/template.h: DIR/squad-template.json or
 * the default Qwen chat markup), the tokenizer is DIR/tokenizer.json unless --tokenizer names one, and
 * each row is scored by the engine. Output, one JSON object on stdout:
 *   {"answers": [{"probs": [...], "choice": "B", "index": 1}, ...],
 *    "tokens": {"state": n, "computed": m, "reused": r}, "ms": t}
 * With --specialists each answer also names its row's "route", and the object carries "route" and
 * "router" (label -> the router's probability) of the request's first row.
 * answers follow the request's questions; ms is the time to build and score the rows (loading the
 * model is not counted). Any error is {"error": "..."} on stdout: exit 1 for a bad request, 2 for a
 * usage error or a model / tokenizer / template that cannot be used.
 *
 * Images: the request's "images" are files (a path, relative to the working directory) or data:
 * URLs; each is decoded and sized by the model's image processor (squad_image_load, bounded by
 * --max-image-pixels) and placed at the start of the state by the template. An image that cannot be
 * read or decoded, a remote URL (squad fetches nothing) or a model without a vision tower is a bad
 * request: exit 1 with the decoder's message naming the image.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "answer_json.h"
#include "commands.h"
#include "image/data_url.h"
#include "image/decode.h"
#include "json_text.h"
#include "options.h"
#include "rows.h"
#include "squad.h"
#include "template.h"
#include "tokenizer.h"
#include "util.h"

static void ask_help(FILE *f) {
    fprintf(f,
            "usage: squad ask --model DIR [--request FILE|-] [options]\n"
            "\n"
            "Answers a text request end to end:\n"
            "  {\"state\": \"...\", \"questions\": [{\"text\": \"...\", \"options\": [\"...\", ...]}, ...],\n"
            "   \"system\": \"...\"}                         (system is optional)\n"
            "and prints\n"
            "  {\"answers\": [{\"probs\": [...], \"choice\": \"B\", \"index\": 1}, ...],\n"
            "   \"tokens\": {\"state\": n, \"computed\": m, \"reused\": r}, \"ms\": t}\n"
            "(ms: building and scoring the rows, not loading the model). Errors are {\"error\": \"...\"} on\n"
            "stdout. Exit status: 0 answered, 1 bad request, 2 usage error or unusable model / tokenizer.\n"
            "\n"
            "options:\n"
            "  --model DIR              a Hugging Face Qwen3.5 model directory (config.json, safetensors,\n"
            "                           tokenizer.json, optionally squad-template.json)\n"
            "  --request FILE           the request (default: stdin; '-' is stdin too)\n"
            "  --tokenizer FILE         a tokenizer.json other than DIR/tokenizer.json\n"
            "  --template FILE          a template other than DIR/squad-template.json (README: Prompt template)\n"
            "  --specialists DIR        a specialists directory: the router picks each row's adapter, and the\n"
            "                           output adds \"route\" and \"router\" (each label's probability)\n"
            "  --specialist LABEL       with --specialists: force this specialist (default auto: the router)\n"
            "%s%s"
            "\n"
            "A request may add \"images\": [\"shot.png\", \"data:image/png;base64,...\"] (PNG, JPEG, WebP files\n"
            "or data: URLs; a model with a vision tower): they open the state, before its text.\n",
            CLI_IMAGE_OPTIONS_HELP, CLI_ENGINE_OPTIONS_HELP);
}

/* Prints {"error": msg} and returns code. */
static int fail_json(int code, const char *msg) {
    json_t *o = json_pack("{s:s}", "error", msg);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "{\"error\": \"out of memory\"}");
    free(s);
    json_decref(o);
    return code;
}

typedef struct ask_args {
    const char *model_dir, *request, *tokenizer, *template_path, *spec_dir, *specialist;
    int64_t max_image_pixels;
    squad_engine_opts opts;
} ask_args;

/* 0 ok, 1 help printed, 2 usage error (already reported). */
static int parse_args(int argc, char **argv, ask_args *a) {
    memset(a, 0, sizeof *a);
    squad_engine_opts_default(&a->opts);
    a->max_image_pixels = SQUAD_IMAGE_DEFAULT_MAX_PIXELS;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        int r = cli_engine_option(argc, argv, &i, &a->opts);
        if (r < 0) return fail_json(2, "bad engine option: see stderr and squad ask --help");
        if (r > 0) continue;
        if ((r = cli_image_option(argc, argv, &i, &a->max_image_pixels)) < 0)
            return fail_json(2, "bad --max-image-pixels: see stderr and squad ask --help");
        if (r > 0) continue;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            ask_help(stdout);
            return 1;
        }
        const char **dst = cli_is_option(s, "--model")         ? &a->model_dir
                           : cli_is_option(s, "--request")     ? &a->request
                           : cli_is_option(s, "--tokenizer")   ? &a->tokenizer
                           : cli_is_option(s, "--template")    ? &a->template_path
                           : cli_is_option(s, "--specialists") ? &a->spec_dir
                           : cli_is_option(s, "--specialist")  ? &a->specialist
                                                               : NULL;
        char msg[160];
        if (!dst) {
            snprintf(msg, sizeof msg, "unknown option '%.80s' (see squad ask --help)", s);
            return fail_json(2, msg);
        }
        if (!(*dst = cli_option_value(argc, argv, &i))) {
            snprintf(msg, sizeof msg, "%.80s needs a value (see squad ask --help)", s);
            return fail_json(2, msg);
        }
    }
    if (!a->model_dir) return fail_json(2, "--model DIR is required (see squad ask --help)");
    return 0;
}

/* The request text: a file, or stdin for NULL / "-". */
static char *read_request(const char *path, size_t *len, squad_err *err) {
    if (path && strcmp(path, "-")) return squad_read_file(path, len, err);
    size_t cap = 1 << 16, n = 0;
    char *buf = squad_malloc(cap + 1, err);
    while (buf) {
        n += fread(buf + n, 1, cap - n, stdin);
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            squad_fail(err, SQUAD_E_NOMEM, "out of memory reading the request");
            return NULL;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* The command line's image loader (image/loader.h): a data: URL (or any "scheme:..." text, which
 * squad_image_text_bytes refuses when it is a remote URL) or a file, then the model's processor. */
typedef struct ask_images {
    const squad_model *model;
    int64_t max_pixels;
} ask_images;

static int is_url(const char *text, size_t len) {
    if (len >= 5 && !strncmp(text, "data:", 5)) return 1;
    const char *colon = memchr(text, ':', len);
    return colon && (size_t)(colon - text) + 2 < len && colon[1] == '/' && colon[2] == '/';
}

static int ask_image_load(void *ctx, const char *text, size_t len, squad_row_image *out, squad_err *err) {
    const ask_images *ai = ctx;
    uint8_t *bytes = NULL;
    size_t n = 0;
    int rc;
    if (is_url(text, len)) {
        rc = squad_image_text_bytes(text, len, &bytes, &n, err);
    } else {
        if (memchr(text, 0, len)) return squad_fail(err, SQUAD_E_INVALID, "a file name cannot hold a NUL character");
        char *path = strndup(text, len);
        if (!path) return squad_fail(err, SQUAD_E_NOMEM, "out of memory");
        bytes = (uint8_t *)squad_read_file(path, &n, err);
        rc = bytes ? 0 : err->code;
        free(path);
    }
    if (rc == 0) rc = squad_image_load(ai->model, bytes, n, ai->max_pixels, out, err);
    free(bytes);
    return rc;
}

static void ask_image_release(void *ctx, squad_row_image *image) {
    (void)ctx;
    squad_row_image_free(image);
}

/* Everything ask holds, freed in one place. */
typedef struct ask_state {
    squad_tokenizer *tok;
    squad_template *tpl;
    squad_model *model;
    squad_engine *engine;
    squad_specialists *sp;
    char *request;
    squad_text_rows rows;
    squad_result *results;
} ask_state;

static void ask_free(ask_state *s) {
    free(s->results);
    squad_text_rows_free(&s->rows);
    squad_engine_free(s->engine);
    squad_specialists_free(s->sp);
    squad_model_free(s->model);
    free(s->request);
    squad_template_free(s->tpl);
    squad_tokenizer_free(s->tok);
}

/* Loads the tokenizer, the template, the request and the model: 0, or an exit code after printing. */
static int ask_load(const ask_args *a, ask_state *s, size_t *req_len) {
    squad_err err = {0};
    if (cli_check_model_dir(a->model_dir, &err)) return fail_json(2, err.msg);
    char *tok_path = a->tokenizer ? NULL : squad_path_join(a->model_dir, "tokenizer.json", &err);
    if (!a->tokenizer && !tok_path) return fail_json(2, err.msg);
    s->tok = squad_tokenizer_load(a->tokenizer ? a->tokenizer : tok_path, &err);
    free(tok_path);
    if (!s->tok) return fail_json(2, err.msg);
    s->tpl = a->template_path ? squad_template_load_file(a->template_path, &err)
                              : squad_template_load_dir(a->model_dir, &err);
    if (!s->tpl) return fail_json(2, err.msg);
    s->request = read_request(a->request, req_len, &err);
    if (!s->request) return fail_json(2, err.msg);
    s->model = squad_model_load(a->model_dir, &err);
    if (!s->model) return fail_json(2, err.msg);
    if (squad_tokenizer_vocab_size(s->tok) > squad_model_vocab_size(s->model)) {
        char msg[256];
        snprintf(msg, sizeof msg, "the tokenizer has %d token ids but the model's vocabulary has %d: they do not belong "
                 "together", squad_tokenizer_vocab_size(s->tok), squad_model_vocab_size(s->model));
        return fail_json(2, msg);
    }
    if (a->specialist && !a->spec_dir) return fail_json(2, "--specialist needs --specialists DIR");
    if (a->spec_dir && !(s->sp = squad_specialists_load(s->model, a->spec_dir, &err))) return fail_json(2, err.msg);
    if (a->specialist && strcmp(a->specialist, "auto") && squad_specialists_find(s->sp, a->specialist) < 0) {
        char msg[200];
        snprintf(msg, sizeof msg, "--specialist '%.100s' is not a label of the specialists", a->specialist);
        return fail_json(2, msg);
    }
    return 0;
}

static int print_answers(const ask_state *s, double ms) {
    long computed = 0, reused = 0;
    for (int i = 0; i < s->rows.n_rows; i++) {
        computed += s->results[i].computed;
        reused += s->results[i].reused;
    }
    squad_buf b = {0};
    squad_ask_json_head(&b, &s->rows, s->results, s->sp, computed, reused);
    squad_buf_printf(&b, ", \"ms\": %.1f}\n", ms);
    char *text = squad_buf_take(&b, NULL);
    if (!text) return fail_json(2, "out of memory");
    fputs(text, stdout);
    free(text);
    return 0;
}

int cmd_ask(int argc, char **argv) {
    ask_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    ask_state s;
    memset(&s, 0, sizeof s);
    size_t req_len = 0;
    if ((rc = ask_load(&a, &s, &req_len)) != 0) {
        ask_free(&s);
        return rc;
    }
    squad_err err = {0};
    json_t *req = squad_json_read_object(s.request, req_len, "the request", &err); /* as the server reads it */
    if (!req) {
        rc = fail_json(err.code == SQUAD_E_INVALID ? 1 : 2, err.msg);
        ask_free(&s);
        return rc;
    }
    json_decref(req);
    double t0 = squad_now_seconds();
    ask_images images = {s.model, a.max_image_pixels};
    const squad_image_loader loader = {ask_image_load, ask_image_release, &images};
    rc = squad_template_build_images(s.tpl, s.tok, s.request, req_len, squad_model_max_tokens(s.model), &loader,
                                     &s.rows, &err);
    if (rc < 0) {
        squad_row_limit_name(&err, "the model's positions");
        /* a bad request, an image that cannot be read or used among them; else the setup failed */
        const int bad = rc == SQUAD_E_INVALID || rc == SQUAD_E_IO || rc == SQUAD_E_UNSUPPORTED;
        rc = fail_json(bad ? 1 : 2, err.msg);
        ask_free(&s);
        return rc;
    }
    double build_s = squad_now_seconds() - t0;
    a.opts.specialists = s.sp;
    s.engine = squad_engine_new(s.model, &a.opts, &err);
    s.results = s.engine ? squad_calloc((size_t)s.rows.n_rows, sizeof(squad_result), &err) : NULL;
    if (!s.engine || !s.results) {
        rc = fail_json(2, err.msg);
        ask_free(&s);
        return rc;
    }
    cli_log_max_tokens("ask", s.engine, s.model); /* the rows were built against the model's limit;
                                                    * a row past the engine's gets its clear error */
    double t_engine = squad_now_seconds(); /* engine creation is setup, not the request's cost */
    const int forced = a.specialist && strcmp(a.specialist, "auto") ? squad_specialists_find(s.sp, a.specialist) + 1 : 0;
    for (int i = 0; i < s.rows.n_rows; i++) s.rows.rows[i].specialist = forced;
    /* all the request's questions together: they share the state, which the first computes and
     * checkpoints and the others restore (docs/batching.md) */
    if ((rc = squad_engine_score_batch(s.engine, s.rows.rows, s.rows.n_rows, NULL, s.results, NULL, NULL, &err)) < 0) {
        rc = fail_json(rc == SQUAD_E_INVALID ? 1 : 2, err.msg);
        ask_free(&s);
        return rc;
    }
    double ms = 1000.0 * (build_s + (squad_now_seconds() - t_engine));
    rc = print_answers(&s, ms);
    ask_free(&s);
    return rc;
}
