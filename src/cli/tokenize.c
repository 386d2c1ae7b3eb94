/*
 * tokenize.c — `squad tokenize` (text -> token ids) and `squad detokenize` (ids -> text) with a
 * Hugging Face tokenizer.json (docs/design.md section 9).
 *
 * tokenize --jsonl reads one JSON string per line and writes one JSON array of ids per line, in order;
 * a line that is not a JSON string (or not valid UTF-8 text) gets {"error": "..."} and the rest go on.
 * Without --jsonl all of stdin is one text and its ids are printed on one line. detokenize reads one
 * JSON array of ids per line and writes one JSON string per line. Exit status: 0 when every line
 * succeeded, 1 when some failed, 2 for usage errors or a tokenizer that cannot be loaded.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "tokenizer.h"
#include "util.h"

static void tokenize_help(FILE *f) {
    fprintf(f,
            "usage: squad tokenize (--tokenizer FILE | --model DIR) [--jsonl] [--plain-special]\n"
            "\n"
            "Encodes text as Hugging Face tokenizers' encode(text, add_special_tokens=false) does.\n"
            "  --jsonl            each stdin line is a JSON string; each output line is a JSON array of ids\n"
            "                     (a bad line gives {\"error\": \"...\"} on its line and the rest go on)\n"
            "  (default)          all of stdin (exactly its bytes, a final newline included) is one text;\n"
            "                     its ids are printed as one JSON array on one line\n"
            "  --tokenizer FILE   a tokenizer.json (byte-level BPE family)\n"
            "  --model DIR        use DIR/tokenizer.json\n"
            "  --plain-special    added tokens such as <|im_start|> in the text are ordinary text\n"
            "Exit status: 0 all lines encoded, 1 some lines failed, 2 usage error or unreadable tokenizer.\n");
}

static void detokenize_help(FILE *f) {
    fprintf(f,
            "usage: squad detokenize (--tokenizer FILE | --model DIR) [--skip-special]\n"
            "\n"
            "Each stdin line is a JSON array of token ids; each output line is the decoded text as a JSON\n"
            "string (bytes that are not valid UTF-8 become U+FFFD, as Hugging Face decodes). A bad line gives\n"
            "{\"error\": \"...\"} on its line and the rest go on.\n"
            "  --tokenizer FILE   a tokenizer.json\n"
            "  --model DIR        use DIR/tokenizer.json\n"
            "  --skip-special     leave special tokens out\n"
            "Exit status: 0 all lines decoded, 1 some lines failed, 2 usage error or unreadable tokenizer.\n");
}

/* {"error": "line N: <prefix><msg>"} (no line part when line is 0). */
static void print_error(size_t line, const char *prefix, const char *msg) {
    char buf[SQUAD_ERR_MSG + 96];
    if (line) snprintf(buf, sizeof buf, "line %zu: %s%s", line, prefix, msg);
    else snprintf(buf, sizeof buf, "%s%s", prefix, msg);
    json_t *o = json_pack("{s:s}", "error", buf);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "{\"error\": \"out of memory\"}");
    free(s);
    json_decref(o);
}

static void print_ids(const int32_t *ids, size_t n) {
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", (int)ids[i]);
    fputs("]\n", stdout);
}

/* Shared option parsing: the tokenizer source and one command-specific flag. */
typedef struct tok_args {
    const char *tokenizer, *model;
    int jsonl, flag; /* flag: --plain-special (tokenize) or --skip-special (detokenize) */
} tok_args;

/* 0 ok, 1 help printed, -1 usage error (message printed). */
static int parse_args(int argc, char **argv, const char *flag_name, int allow_jsonl, tok_args *a,
                      void (*help)(FILE *)) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            help(stdout);
            return 1;
        } else if (cli_is_option(s, "--tokenizer") || cli_is_option(s, "--model")) {
            const char **dst = cli_is_option(s, "--model") ? &a->model : &a->tokenizer;
            if (!(*dst = cli_option_value(argc, argv, &i))) return -1;
        } else if (allow_jsonl && cli_is_option(s, "--jsonl")) {
            if (cli_flag(argv, i)) return -1;
            a->jsonl = 1;
        } else if (cli_is_option(s, flag_name)) {
            if (cli_flag(argv, i)) return -1;
            a->flag = 1;
        } else {
            fprintf(stderr, "squad %s: unknown option '%s' (see squad %s --help)\n", argv[0], s, argv[0]);
            return -1;
        }
    }
    if (!a->tokenizer && !a->model) {
        fprintf(stderr, "squad %s: --tokenizer FILE or --model DIR is required (see squad %s --help)\n", argv[0],
                argv[0]);
        return -1;
    }
    return 0;
}

static squad_tokenizer *load_tokenizer(const tok_args *a, const char *cmd) {
    squad_err err = {0};
    if (!a->tokenizer && cli_check_model_dir(a->model, &err)) {
        fprintf(stderr, "squad %s: %s\n", cmd, err.msg);
        return NULL;
    }
    char *path = a->tokenizer ? NULL : squad_path_join(a->model, "tokenizer.json", &err);
    squad_tokenizer *tok = (a->tokenizer || path) ? squad_tokenizer_load(a->tokenizer ? a->tokenizer : path, &err) : NULL;
    free(path);
    if (!tok) fprintf(stderr, "squad %s: %s\n", cmd, err.msg);
    return tok;
}

/* Plain mode: all of stdin is one text. */
static int tokenize_stdin(squad_tokenizer *tok, unsigned flags) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            print_error(0, "", "out of memory reading stdin");
            return 1;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) free(buf);
        buf = nb;
        cap *= 2;
    }
    squad_err err = {0};
    squad_idvec v = {0};
    int rc = squad_tokenize_append(tok, buf, n, flags, &v, &err);
    if (rc == 0) print_ids(v.v, v.n);
    else print_error(0, "", err.msg);
    squad_idvec_free(&v);
    free(buf);
    return rc == 0 ? 0 : 1;
}

/* Strips a trailing "\n" or "\r\n". */
static size_t chomp(char *line, size_t n) {
    if (n && line[n - 1] == '\n') n--;
    if (n && line[n - 1] == '\r') n--;
    line[n] = 0;
    return n;
}

static int tokenize_jsonl(squad_tokenizer *tok, unsigned flags) {
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    int failed = 0;
    squad_idvec v = {0};
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t n = chomp(line, (size_t)got);
        json_error_t jerr;
        json_t *s = json_loadb(line, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        squad_err err = {0};
        v.n = 0;
        if (!s) {
            print_error(lineno, "not valid JSON: ", n ? jerr.text : "empty line");
            failed = 1;
        } else if (!json_is_string(s)) {
            print_error(lineno, "", "expected a JSON string");
            failed = 1;
        } else if (squad_tokenize_append(tok, json_string_value(s), json_string_length(s), flags, &v, &err) < 0) {
            print_error(lineno, "", err.msg);
            failed = 1;
        } else {
            print_ids(v.v, v.n);
        }
        json_decref(s);
        fflush(stdout);
    }
    squad_idvec_free(&v);
    free(line);
    return failed;
}

int cmd_tokenize(int argc, char **argv) {
    tok_args a;
    int r = parse_args(argc, argv, "--plain-special", 1, &a, tokenize_help);
    if (r) return r > 0 ? 0 : 2;
    squad_tokenizer *tok = load_tokenizer(&a, "tokenize");
    if (!tok) return 2;
    unsigned flags = a.flag ? SQUAD_TOK_PLAIN : 0;
    int rc = a.jsonl ? tokenize_jsonl(tok, flags) : tokenize_stdin(tok, flags);
    squad_tokenizer_free(tok);
    return rc;
}

/* One line of ids to text: 0 ok (printed), else the message in err. */
static int detokenize_line(squad_tokenizer *tok, json_t *arr, int skip_special, squad_err *err) {
    if (!json_is_array(arr)) return squad_fail(err, SQUAD_E_INVALID, "expected a JSON array of token ids");
    size_t n = json_array_size(arr);
    int32_t *ids = squad_malloc((n ? n : 1) * sizeof(int32_t), err);
    if (!ids) return SQUAD_E_NOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(ids);
            return squad_fail(err, SQUAD_E_INVALID, "element %zu is not a token id (a non-negative integer)", i);
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    char *text = NULL;
    size_t len = 0;
    int rc = squad_detokenize(tok, ids, n, skip_special, &text, &len, err);
    free(ids);
    if (rc < 0) return rc;
    json_t *s = json_stringn(text, len);
    char *out = s ? json_dumps(s, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    free(text);
    json_decref(s);
    if (!out) return squad_fail(err, SQUAD_E_NOMEM, "out of memory");
    printf("%s\n", out);
    free(out);
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    tok_args a;
    int r = parse_args(argc, argv, "--skip-special", 0, &a, detokenize_help);
    if (r) return r > 0 ? 0 : 2;
    squad_tokenizer *tok = load_tokenizer(&a, "detokenize");
    if (!tok) return 2;
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    int failed = 0;
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t n = chomp(line, (size_t)got);
        json_error_t jerr;
        json_t *arr = json_loadb(line, n, 0, &jerr);
        squad_err err = {0};
        if (!arr) {
            print_error(lineno, "not valid JSON: ", n ? jerr.text : "empty line");
            failed = 1;
        } else if (detokenize_line(tok, arr, a.flag, &err) < 0) {
            print_error(lineno, "", err.msg);
            failed = 1;
        }
        json_decref(arr);
        fflush(stdout);
    }
    free(line);
    squad_tokenizer_free(tok);
    return failed;
}
