/*
 * decisions.c — OpenAI's Decisions API and System One's shape as rows and responses (see
 * decisions.h; the contract is DECISIONS-API.md, sections A to F).
 *
 * Design:
 * - Parsing and validation happen in one pass over the jansson tree; the first problem found
 *   becomes a squad_dapi_error whose message and param name the field by its JSON path.
 * - A request is first reduced to plain strings: the system message, the state, and per question
 *   its block (instructions line, option lines, closing line). Everything that came from the
 *   request is text; only the chat markup around it is template text.
 * - Rendering feeds segments to a small token builder: template segments have their added tokens
 *   (<|im_start|> ...) turned into ids, the text between them is collected and encoded in one piece
 *   with added tokens disabled. The builder is flushed at the end of the prefix, so the state's
 *   tokens never depend on the questions and every row shares ids[0, state_len).
 * - Labels: the answer slot is the last token of the generation prompt, whose text after its last
 *   special token is "\n\n"; a label's token is the one token that encoding "\n\n" + label adds to
 *   encoding "\n\n". The context finds them once; an API whose labels are not distinct single
 *   tokens is disabled with the reason.
 * - A prompt_cache_breakpoint's position is the number of leading tokens of the prefix that the
 *   text before the breakpoint fixes: the common prefix of the prefix's ids and the ids of the
 *   prefix cut at that point (a token that straddles the cut is not counted).
 * - Responses are built from the request tree kept in the parsed request (names, typed values,
 *   question ids) and the rows' squad_result.
 */
#define _DEFAULT_SOURCE
#include "decisions.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "json_text.h"
#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * The rendering (section C)
 * ------------------------------------------------------------------------------------------- */

#define SYSTEM_OPEN "<|im_start|>system\n"
#define SYSTEM_CLOSE "<|im_end|>\n"
#define USER_OPEN "<|im_start|>user\n"
#define STATE_END "\n\n"
#define GENERATION_PROMPT "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
/* The generation prompt's text after its last special token: what a label follows. */
#define SLOT_TAIL "\n\n"
#define MARKUP_OPEN "<|im_start|>"
#define MARKUP_CLOSE "<|im_end|>"

#define CLOSE_LETTER "Answer with the letter of one option only."
#define CLOSE_NOUL "Answer with yes or no only."
#define CLOSE_NUMBER "Answer with the number of one level only."

#define MESSAGE_JOIN "\n\n" /* between messages of one role */
#define PART_JOIN "\n"      /* between parts of one message, and of a question's instructions */

/* Field paths and short labels are cut to their buffers: a cut path still names the field. */
static void field_path(char *out, size_t cap, const char *fmt, ...) SQUAD_PRINTF(3, 4);
static void field_path(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, cap, fmt, ap);
    va_end(ap);
}
#define FIELD(buf, ...) field_path(buf, sizeof buf, __VA_ARGS__)

/* Every row repeats the state: a bound on all rows' ids together when no max_tokens bounds them. */
#define MAX_TOTAL_IDS ((size_t)1 << 26)

static const char *const NOUL_LABELS[4] = {"yes", "no", "Yes", "No"};
#define N_NOUL 4

typedef enum { Q_PREDICATE, Q_CHOICE, Q_SCORE, Q_NOUL, Q_SO_CHOICE, Q_SO_SCORE } qkind;

struct squad_dapi_ctx {
    squad_tokenizer *tok;
    char *served;
    char **specialists;
    int n_specialists;
    int max_tokens;
    int32_t letters[SQUAD_DAPI_MAX_CHOICES]; /* A..Z */
    int32_t digits[SQUAD_DAPI_MAX_LEVELS];   /* 0..9 */
    int32_t noul[N_NOUL];                    /* yes no Yes No */
    char *disabled[SQUAD_DAPI_COUNT];
};

/* One question as parsed: what the response needs besides the probabilities. */
typedef struct dapi_question {
    qkind kind;
    const char *id; /* System One: its key */
    json_t *q;      /* the question object (borrowed from the kept tree) */
    json_t *opts;   /* decisions choices / levels; System One criteria */
    int n_opts;     /* options (noul: the four tokens) */
    int32_t labels[SQUAD_DAPI_MAX_CHOICES];
} dapi_question;

struct squad_dapi_store {
    json_t *root;
    dapi_question *qs;
    int32_t **ids;
    int32_t *slots, *nopts;
    char *prefix_text;
    char **suffix;
    char *model;
};

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

static const char *status_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 501: return "not_implemented_error";
    case 503: return "service_unavailable_error";
    default: return "server_error";
    }
}

/* Replaces each byte that does not start valid UTF-8 with '?': a message may quote request text
 * cut at any byte (by jansson or by the buffer), and an error body must be valid JSON. */
static void utf8_repair(char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n) {
        size_t bad_at = i + squad_utf8_invalid_offset(s + i, n - i);
        if (bad_at >= n) break;
        s[bad_at] = '?';
        i = bad_at + 1;
    }
}

static void error_vset(squad_dapi_error *e, int status, const char *param, const char *fmt, va_list ap) {
    if (!e) return;
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", status_type(status));
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    utf8_repair(e->param);
    utf8_repair(e->message);
}

void squad_dapi_error_set(squad_dapi_error *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, status, param, fmt, ap);
    va_end(ap);
}

/* A 400 naming param; returns -1 so callers can `return bad(...)`. */
static int bad(squad_dapi_error *e, const char *param, const char *fmt, ...) SQUAD_PRINTF(3, 4);
static int bad(squad_dapi_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, 400, param, fmt, ap);
    va_end(ap);
    return -1;
}

static int from_err(squad_dapi_error *e, const squad_err *err) {
    squad_dapi_error_set(e, err->code == SQUAD_E_NOMEM ? 500 : 400, NULL, "%s", err->msg);
    return -1;
}

char *squad_dapi_error_body(const squad_dapi_error *e) {
    json_t *inner = json_pack("{s:s, s:s, s:o, s:i}", "message", e->message, "type", e->type, "param",
                              e->param[0] ? json_string(e->param) : json_null(), "code", e->status);
    if (!inner) return NULL;
    json_t *body = json_pack("{s:o}", "error", inner);
    if (!body) return NULL;
    char *s = json_dumps(body, 0);
    json_decref(body);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * The token builder
 * ------------------------------------------------------------------------------------------- */

typedef struct tok_builder {
    squad_tokenizer *tok;
    squad_idvec ids;
    squad_buf pend; /* text not yet encoded */
} tok_builder;

static int tb_flush(tok_builder *b, squad_err *err) {
    if (b->pend.oom) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (request text)");
    if (!b->pend.n) return 0;
    int rc = squad_tokenize_append(b->tok, b->pend.s, b->pend.n, SQUAD_TOK_PLAIN, &b->ids, err);
    squad_buf_reset(&b->pend);
    return rc;
}

static int tb_plain(tok_builder *b, const char *s, size_t n, squad_err *err) {
    if (squad_buf_put(&b->pend, s, n) < 0) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (request text)");
    return 0;
}

/* Template text: its added tokens become their ids, the rest is text. */
static int tb_template(tok_builder *b, const char *s, size_t n, squad_err *err) {
    while (n) {
        size_t st, en;
        int32_t id;
        if (!squad_tokenizer_find_added(b->tok, s, n, &st, &en, &id)) return tb_plain(b, s, n, err);
        int rc;
        if ((rc = tb_plain(b, s, st, err)) < 0 || (rc = tb_flush(b, err)) < 0 ||
            (rc = squad_idvec_push(&b->ids, id, err)) < 0)
            return rc;
        s += en;
        n -= en;
    }
    return 0;
}

static void tb_free(tok_builder *b) {
    squad_idvec_free(&b->ids);
    free(b->pend.s);
    memset(&b->pend, 0, sizeof b->pend);
}

/* The prefix, rendered up to `cut` bytes of its text (SIZE_MAX: all of it), then flushed. Its text
 * is SYSTEM_OPEN sys SYSTEM_CLOSE (when sys is not empty), USER_OPEN state STATE_END. */
static int render_prefix(tok_builder *b, const char *sys, size_t sys_n, const char *state, size_t state_n,
                         size_t cut, squad_err *err) {
    struct {
        int plain;
        const char *s;
        size_t n;
    } seg[6];
    int k = 0;
    if (sys_n) {
        seg[k].plain = 0, seg[k].s = SYSTEM_OPEN, seg[k].n = strlen(SYSTEM_OPEN), k++;
        seg[k].plain = 1, seg[k].s = sys, seg[k].n = sys_n, k++;
        seg[k].plain = 0, seg[k].s = SYSTEM_CLOSE, seg[k].n = strlen(SYSTEM_CLOSE), k++;
    }
    seg[k].plain = 0, seg[k].s = USER_OPEN, seg[k].n = strlen(USER_OPEN), k++;
    seg[k].plain = 1, seg[k].s = state, seg[k].n = state_n, k++;
    seg[k].plain = 0, seg[k].s = STATE_END, seg[k].n = strlen(STATE_END), k++;
    size_t at = 0;
    for (int i = 0; i < k && at < cut; i++) {
        size_t n = seg[i].n < cut - at ? seg[i].n : cut - at;
        int rc = seg[i].plain ? tb_plain(b, seg[i].s, n, err) : tb_template(b, seg[i].s, n, err);
        if (rc < 0) return rc;
        at += n;
    }
    return tb_flush(b, err);
}

/* ---------------------------------------------------------------------------------------------
 * The context: label tokens
 * ------------------------------------------------------------------------------------------- */

/* The one token encoding SLOT_TAIL + label adds to encoding SLOT_TAIL; -1 when not exactly one. */
static int32_t label_token(squad_tokenizer *tok, const char *label, squad_err *err) {
    squad_idvec base = {0}, with = {0};
    char text[64];
    FIELD(text, "%s%s", SLOT_TAIL, label);
    int32_t id = -1;
    if (squad_tokenize_append(tok, SLOT_TAIL, strlen(SLOT_TAIL), SQUAD_TOK_PLAIN, &base, err) == 0 &&
        squad_tokenize_append(tok, text, strlen(text), SQUAD_TOK_PLAIN, &with, err) == 0 && with.n == base.n + 1 &&
        (base.n == 0 || !memcmp(base.v, with.v, base.n * sizeof(int32_t))))
        id = with.v[base.n];
    squad_idvec_free(&base);
    squad_idvec_free(&with);
    return id;
}

/* Finds n labels' tokens; NULL when all are distinct single tokens, else why not (malloc'd). */
static char *find_labels(squad_tokenizer *tok, const char *const *labels, int n, int32_t *out, squad_err *err) {
    char why[256];
    for (int i = 0; i < n; i++) {
        squad_err e = {0};
        out[i] = label_token(tok, labels[i], &e);
        if (out[i] < 0) {
            snprintf(why, sizeof why,
                     "the label \"%s\" is not one token after the generation prompt with this tokenizer", labels[i]);
            return squad_strdup(why, err);
        }
        for (int j = 0; j < i; j++)
            if (out[j] == out[i]) {
                FIELD(why, "the labels \"%s\" and \"%s\" are the same token with this tokenizer",
                         labels[j], labels[i]);
                return squad_strdup(why, err);
            }
    }
    return NULL;
}

void squad_dapi_ctx_free(squad_dapi_ctx *c) {
    if (!c) return;
    free(c->served);
    for (int i = 0; i < c->n_specialists; i++) free(c->specialists[i]);
    free(c->specialists);
    for (int i = 0; i < SQUAD_DAPI_COUNT; i++) free(c->disabled[i]);
    free(c);
}

squad_dapi_ctx *squad_dapi_ctx_new(squad_tokenizer *tok, const char *served_name,
                                   const char *const *specialist_names, int n_specialists, int max_tokens,
                                   squad_err *err) {
    if (!tok || !served_name || n_specialists < 0 || (n_specialists > 0 && !specialist_names)) {
        squad_fail(err, SQUAD_E_INVALID, "squad_dapi_ctx_new: a tokenizer and a served name are required");
        return NULL;
    }
    squad_dapi_ctx *c = squad_calloc(1, sizeof *c, err);
    if (!c) return NULL;
    c->tok = tok;
    c->max_tokens = max_tokens > 0 ? max_tokens : 0;
    c->served = squad_strdup(served_name, err);
    c->specialists = n_specialists ? squad_calloc((size_t)n_specialists, sizeof(char *), err) : NULL;
    if (!c->served || (n_specialists && !c->specialists)) goto fail;
    for (int i = 0; i < n_specialists; i++) {
        c->n_specialists = i + 1;
        if (!(c->specialists[i] = squad_strdup(specialist_names[i], err))) goto fail;
    }
    if (err) err->code = 0;
    /* Labels: A..Z, 0..9, yes / no / Yes / No. */
    char letter_text[SQUAD_DAPI_MAX_CHOICES][2], digit_text[SQUAD_DAPI_MAX_LEVELS][2];
    const char *letters[SQUAD_DAPI_MAX_CHOICES], *digits[SQUAD_DAPI_MAX_LEVELS];
    for (int i = 0; i < SQUAD_DAPI_MAX_CHOICES; i++) {
        letter_text[i][0] = (char)('A' + i), letter_text[i][1] = 0;
        letters[i] = letter_text[i];
    }
    for (int i = 0; i < SQUAD_DAPI_MAX_LEVELS; i++) {
        digit_text[i][0] = (char)('0' + i), digit_text[i][1] = 0;
        digits[i] = digit_text[i];
    }
    char *why = NULL;
    if (squad_tokenizer_token_id(tok, MARKUP_OPEN) < 0 || squad_tokenizer_token_id(tok, MARKUP_CLOSE) < 0) {
        why = squad_strdup("the tokenizer has no " MARKUP_OPEN " / " MARKUP_CLOSE
                           " tokens: the decision APIs render Qwen chat markup", err);
        if (!why) goto fail;
        c->disabled[SQUAD_DAPI_DECISIONS] = why;
        if (!(c->disabled[SQUAD_DAPI_SYSTEMONE] = squad_strdup(why, err))) goto fail;
        return c;
    }
    why = find_labels(tok, letters, SQUAD_DAPI_MAX_CHOICES, c->letters, err);
    if (!why && err && err->code) goto fail;
    if (why) { /* both APIs letter their choices */
        c->disabled[SQUAD_DAPI_DECISIONS] = why;
        if (!(c->disabled[SQUAD_DAPI_SYSTEMONE] = squad_strdup(why, err))) goto fail;
        return c;
    }
    why = find_labels(tok, digits, SQUAD_DAPI_MAX_LEVELS, c->digits, err);
    if (!why && !(err && err->code)) why = find_labels(tok, NOUL_LABELS, N_NOUL, c->noul, err);
    if (!why && err && err->code) goto fail;
    c->disabled[SQUAD_DAPI_SYSTEMONE] = why;
    return c;
fail:
    squad_dapi_ctx_free(c);
    return NULL;
}

const char *squad_dapi_disabled(const squad_dapi_ctx *c, squad_dapi api) {
    if (api < 0 || api >= SQUAD_DAPI_COUNT) return "no such API";
    return c->disabled[api];
}

/* ---------------------------------------------------------------------------------------------
 * Parsing helpers
 * ------------------------------------------------------------------------------------------- */

/* The parse in progress. */
typedef struct parse_state {
    const squad_dapi_ctx *ctx;
    squad_dapi_error *e;
    squad_buf sys, state; /* the system message and the state, as text */
    int have_sys;       /* decisions: a system / developer message was given */
    int have_state;     /* decisions: a user message was given */
    /* breakpoints as byte offsets into the system message or the state */
    size_t bp_off[SQUAD_DAPI_MAX_BREAKPOINTS];
    int bp_in_sys[SQUAD_DAPI_MAX_BREAKPOINTS];
    int n_bp;
    dapi_question *qs;
    int n_q;
    squad_buf *blocks; /* [n_q] */
} parse_state;

static int oom(squad_dapi_error *e) {
    squad_dapi_error_set(e, 500, NULL, "out of memory");
    return -1;
}

/* Checks that obj has only keys from the NULL-terminated list; names the first other one. */
static int only_keys(parse_state *ps, json_t *obj, const char *where, const char *const *keys) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        int ok = 0;
        for (int i = 0; keys[i] && !ok; i++) ok = !strcmp(k, keys[i]);
        if (!ok) {
            char param[128];
            FIELD(param, "%s%s%s", where, where[0] ? "." : "", k);
            return bad(ps->e, param, "unknown field \"%s\"%s%s", param, where[0] ? " in " : "", where);
        }
    }
    return 0;
}

/* obj[key] with absent and null the same (NULL). */
static json_t *get(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static const char *type_name(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Appends v's text: a string as it is, anything else as its JSON text (section E). */
static int put_text(parse_state *ps, squad_buf *b, json_t *v) {
    if (json_is_string(v)) return squad_buf_put(b, json_string_value(v), json_string_length(v)) < 0 ? oom(ps->e) : 0;
    squad_err err = {0};
    size_t n;
    char *t = squad_json_text(v, &n, &err);
    if (!t) return from_err(ps->e, &err);
    int rc = squad_buf_put(b, t, n);
    free(t);
    return rc < 0 ? oom(ps->e) : 0;
}

/* ---------------------------------------------------------------------------------------------
 * The decisions API (section A)
 * ------------------------------------------------------------------------------------------- */

/* One content part of a message: appends its text to b; a breakpoint records b's length after it. */
static int decisions_part(parse_state *ps, json_t *part, const char *where, squad_buf *b, int in_sys) {
    static const char *const TEXT_KEYS[] = {"type", "text", "prompt_cache_breakpoint", NULL};
    static const char *const JSON_KEYS[] = {"type", "data", NULL};
    char param[128];
    if (!json_is_object(part)) return bad(ps->e, where, "%s must be an object (a content part)", where);
    json_t *type = json_object_get(part, "type");
    FIELD(param, "%s.type", where);
    if (!json_is_string(type)) return bad(ps->e, param, "%s must be \"input_text\" or \"input_json\"", param);
    const char *t = json_string_value(type);
    if (!strcmp(t, "input_text")) {
        if (only_keys(ps, part, where, TEXT_KEYS) < 0) return -1;
        json_t *text = json_object_get(part, "text");
        FIELD(param, "%s.text", where);
        if (!json_is_string(text)) return bad(ps->e, param, "%s must be a string", param);
        if (put_text(ps, b, text) < 0) return -1;
        json_t *bp = get(part, "prompt_cache_breakpoint");
        if (bp) {
            json_t *mode = json_object_get(bp, "mode");
            FIELD(param, "%s.prompt_cache_breakpoint", where);
            if (!json_is_object(bp) || json_object_size(bp) != 1 || !json_is_string(mode) ||
                strcmp(json_string_value(mode), "explicit"))
                return bad(ps->e, param, "%s must be {\"mode\": \"explicit\"}", param);
            if (ps->n_bp < SQUAD_DAPI_MAX_BREAKPOINTS) {
                ps->bp_off[ps->n_bp] = b->n;
                ps->bp_in_sys[ps->n_bp] = in_sys;
                ps->n_bp++;
            }
        }
        return 0;
    }
    if (!strcmp(t, "input_json")) {
        if (only_keys(ps, part, where, JSON_KEYS) < 0) return -1;
        json_t *data = json_object_get(part, "data");
        FIELD(param, "%s.data", where);
        if (!json_is_object(data) && !json_is_array(data))
            return bad(ps->e, param, "%s must be an object or an array", param);
        return put_text(ps, b, data);
    }
    return bad(ps->e, param, "%s: content parts of type \"%.40s\" are not supported (input_text, input_json)", param,
               t);
}

/* One input item (a message): its text joins the system message or the state. */
static int decisions_item(parse_state *ps, json_t *item, size_t i) {
    static const char *const KEYS[] = {"type", "role", "content", NULL};
    char where[64], param[128];
    FIELD(where, "input[%zu]", i);
    if (!json_is_object(item)) return bad(ps->e, where, "%s must be an object (a message)", where);
    json_t *type = get(item, "type");
    FIELD(param, "%s.type", where);
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "message")))
        return bad(ps->e, param, "%s: input items of type %s%.40s%s are not supported (only messages)", param,
                   json_is_string(type) ? "\"" : "", json_is_string(type) ? json_string_value(type) : type_name(type),
                   json_is_string(type) ? "\"" : "");
    if (only_keys(ps, item, where, KEYS) < 0) return -1;
    json_t *role = json_object_get(item, "role");
    FIELD(param, "%s.role", where);
    if (!json_is_string(role)) return bad(ps->e, param, "%s must be \"user\", \"system\" or \"developer\"", param);
    const char *r = json_string_value(role);
    int in_sys = !strcmp(r, "system") || !strcmp(r, "developer");
    if (!in_sys && strcmp(r, "user"))
        return bad(ps->e, param, "%s: messages with role \"%.40s\" are not supported (user, system, developer)", param,
                   r);
    squad_buf *b = in_sys ? &ps->sys : &ps->state;
    int *have = in_sys ? &ps->have_sys : &ps->have_state;
    if (*have && squad_buf_puts(b, MESSAGE_JOIN) < 0) return oom(ps->e);
    *have = 1;
    json_t *content = json_object_get(item, "content");
    FIELD(param, "%s.content", where);
    if (json_is_string(content)) return put_text(ps, b, content);
    if (!json_is_array(content)) return bad(ps->e, param, "%s must be a string or a list of content parts", param);
    for (size_t j = 0; j < json_array_size(content); j++) {
        char pw[128];
        FIELD(pw, "%s[%zu]", param, j);
        if (j && squad_buf_puts(b, PART_JOIN) < 0) return oom(ps->e);
        if (decisions_part(ps, json_array_get(content, j), pw, b, in_sys) < 0) return -1;
    }
    return 0;
}

static int decisions_input(parse_state *ps, json_t *input) {
    if (!input) return bad(ps->e, "input", "input is missing");
    if (json_is_string(input)) {
        ps->have_state = 1;
        return put_text(ps, &ps->state, input);
    }
    if (!json_is_array(input)) return bad(ps->e, "input", "input must be a string or a list of messages");
    for (size_t i = 0; i < json_array_size(input); i++)
        if (decisions_item(ps, json_array_get(input, i), i) < 0) return -1;
    return 0;
}

/* An option line: "{label}: {name}" or "{label}: {name} - {description}". */
static int option_line(parse_state *ps, squad_buf *b, const char *label, const char *name, size_t name_n,
                       json_t *desc) {
    if (squad_buf_puts(b, PART_JOIN) < 0 || squad_buf_puts(b, label) < 0 || squad_buf_puts(b, ": ") < 0 || squad_buf_put(b, name, name_n) < 0)
        return oom(ps->e);
    if (json_is_string(desc) && json_string_length(desc) &&
        (squad_buf_puts(b, " - ") < 0 || squad_buf_put(b, json_string_value(desc), json_string_length(desc)) < 0))
        return oom(ps->e);
    return 0;
}

/* Starts a block with "Question: {instructions}" when they are not empty. */
static int block_start(parse_state *ps, squad_buf *b, const squad_buf *instr) {
    if (instr->n && (squad_buf_puts(b, "Question: ") < 0 || squad_buf_put(b, instr->s, instr->n) < 0)) return oom(ps->e);
    return 0;
}

/* Closes a block; when it has no instructions the first option line lost its leading newline. */
static int block_end(parse_state *ps, squad_buf *b, const char *closing) {
    if (squad_buf_puts(b, PART_JOIN) < 0 || squad_buf_puts(b, closing) < 0 || squad_buf_put(b, "", 0) < 0) return oom(ps->e);
    /* Lines are joined by "\n": when instructions were empty the block starts with a join. */
    if (b->s[0] == '\n') {
        memmove(b->s, b->s + 1, b->n);
        b->n--;
    }
    return 0;
}

static int decisions_instructions(parse_state *ps, json_t *v, const char *where, squad_buf *out) {
    char param[128];
    FIELD(param, "%s.instructions", where);
    if (!v) return bad(ps->e, param, "%s is missing", param);
    if (json_is_string(v)) return put_text(ps, out, v);
    if (!json_is_array(v)) return bad(ps->e, param, "%s must be a string or a list of input_text parts", param);
    static const char *const KEYS[] = {"type", "text", "prompt_cache_breakpoint", NULL};
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *p = json_array_get(v, i);
        char pw[160], pp[176];
        FIELD(pw, "%s[%zu]", param, i);
        if (!json_is_object(p)) return bad(ps->e, pw, "%s must be an input_text part", pw);
        json_t *t = json_object_get(p, "type"), *text = json_object_get(p, "text");
        FIELD(pp, "%s.type", pw);
        if (!json_is_string(t) || strcmp(json_string_value(t), "input_text"))
            return bad(ps->e, pp, "%s must be \"input_text\"", pp);
        if (only_keys(ps, p, pw, KEYS) < 0) return -1;
        FIELD(pp, "%s.text", pw);
        if (!json_is_string(text)) return bad(ps->e, pp, "%s must be a string", pp);
        if ((i && squad_buf_puts(out, PART_JOIN) < 0)) return oom(ps->e);
        if (put_text(ps, out, text) < 0) return -1;
    }
    return 0;
}

static int decisions_question(parse_state *ps, json_t *q, int qi) {
    static const char *const KEYS[3][6] = {{"type", "instructions", "name", NULL},
                                           {"type", "instructions", "name", "choices", NULL},
                                           {"type", "instructions", "name", "levels", NULL}};
    dapi_question *dq = &ps->qs[qi];
    squad_buf *b = &ps->blocks[qi];
    char where[48], param[128];
    FIELD(where, "questions[%d]", qi);
    if (!json_is_object(q)) return bad(ps->e, where, "%s must be an object", where);
    dq->q = q;
    json_t *type = json_object_get(q, "type");
    FIELD(param, "%s.type", where);
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!strcmp(t, "predicate")) dq->kind = Q_PREDICATE;
    else if (!strcmp(t, "choice")) dq->kind = Q_CHOICE;
    else if (!strcmp(t, "score")) dq->kind = Q_SCORE;
    else return bad(ps->e, param, "%s must be \"predicate\", \"choice\" or \"score\"", param);
    if (only_keys(ps, q, where, KEYS[dq->kind]) < 0) return -1;
    json_t *name = get(q, "name");
    FIELD(param, "%s.name", where);
    if (name && !json_is_string(name)) return bad(ps->e, param, "%s must be a string", param);
    squad_buf instr = {0};
    int rc = decisions_instructions(ps, json_object_get(q, "instructions"), where, &instr);
    if (rc == 0) rc = block_start(ps, b, &instr);
    free(instr.s);
    if (rc < 0) return -1;
    const int32_t *letters = ps->ctx->letters;
    if (dq->kind == Q_PREDICATE) {
        dq->n_opts = 2;
        if (option_line(ps, b, "A", "false", 5, NULL) < 0 || option_line(ps, b, "B", "true", 4, NULL) < 0) return -1;
    } else {
        int choice = dq->kind == Q_CHOICE;
        const char *field = choice ? "choices" : "levels";
        int max = choice ? SQUAD_DAPI_MAX_CHOICES : SQUAD_DAPI_MAX_LEVELS;
        json_t *opts = json_object_get(q, field);
        FIELD(param, "%s.%s", where, field);
        if (!json_is_array(opts))
            return bad(ps->e, param, "%s %s", param, opts ? "must be a list" : "is missing");
        size_t n = json_array_size(opts);
        if (n < 2 || n > (size_t)max)
            return bad(ps->e, param, "%s has %zu entries; between 2 and %d are allowed", param, n, max);
        dq->opts = opts;
        dq->n_opts = (int)n;
        for (size_t j = 0; j < n; j++) {
            static const char *const CHOICE_KEYS[] = {"value", "description", NULL};
            static const char *const LEVEL_KEYS[] = {"label", "description", NULL};
            json_t *o = json_array_get(opts, j);
            char ow[160], op[176];
            FIELD(ow, "%s[%zu]", param, j);
            if (!json_is_object(o)) return bad(ps->e, ow, "%s must be an object", ow);
            if (only_keys(ps, o, ow, choice ? CHOICE_KEYS : LEVEL_KEYS) < 0) return -1;
            json_t *desc = get(o, "description");
            FIELD(op, "%s.description", ow);
            if (desc && !json_is_string(desc)) return bad(ps->e, op, "%s must be a string", op);
            json_t *v = json_object_get(o, choice ? "value" : "label");
            FIELD(op, "%s.%s", ow, choice ? "value" : "label");
            char label[2] = {(char)('A' + j), 0};
            if (choice) {
                if (!json_is_string(v) && !json_is_boolean(v))
                    return bad(ps->e, op, "%s must be a string or a boolean", op);
                for (size_t k = 0; k < j; k++)
                    if (json_equal(v, json_object_get(json_array_get(opts, k), "value")))
                        return bad(ps->e, op, "%s repeats %s[%zu].value; values must be distinct", op, param, k);
                squad_err err = {0};
                size_t tn;
                char *text = squad_json_text(v, &tn, &err);
                if (!text) return from_err(ps->e, &err);
                rc = option_line(ps, b, label, text, tn, desc);
                free(text);
                if (rc < 0) return -1;
            } else {
                if (!json_is_string(v)) return bad(ps->e, op, "%s %s", op, v ? "must be a string" : "is missing");
                if (option_line(ps, b, label, json_string_value(v), json_string_length(v), desc) < 0) return -1;
            }
        }
    }
    memcpy(dq->labels, letters, (size_t)dq->n_opts * sizeof(int32_t));
    return block_end(ps, b, CLOSE_LETTER);
}

/* Model names: the served name or a specialist's (index in *spec, -1 for the served name). */
static int find_model(const squad_dapi_ctx *c, const char *name, int *spec) {
    *spec = -1;
    if (!strcmp(name, c->served)) return 1;
    for (int i = 0; i < c->n_specialists; i++)
        if (!strcmp(name, c->specialists[i])) {
            *spec = i;
            return 1;
        }
    return 0;
}

static int not_found(parse_state *ps, const char *name) {
    squad_dapi_error_set(ps->e, 404, "model", "the model \"%.200s\" does not exist (this server serves \"%.200s\")",
                         name, ps->ctx->served);
    return -1;
}

static int decisions_parse(parse_state *ps, json_t *root, int *spec) {
    static const char *const KEYS[] = {"model",           "input",           "questions", "safety_identifier",
                                       "prompt_cache_key", "prompt_cache_options", NULL};
    if (only_keys(ps, root, "", KEYS) < 0) return -1;
    json_t *model = json_object_get(root, "model");
    if (!json_is_string(model)) return bad(ps->e, "model", "model %s", model ? "must be a string" : "is missing");
    if (!find_model(ps->ctx, json_string_value(model), spec)) return not_found(ps, json_string_value(model));
    json_t *v;
    if ((v = get(root, "safety_identifier")) && !json_is_string(v))
        return bad(ps->e, "safety_identifier", "safety_identifier must be a string");
    if ((v = get(root, "prompt_cache_key")) && !json_is_string(v))
        return bad(ps->e, "prompt_cache_key", "prompt_cache_key must be a string");
    if ((v = get(root, "prompt_cache_options")) && !json_is_object(v))
        return bad(ps->e, "prompt_cache_options", "prompt_cache_options must be an object");
    if (decisions_input(ps, json_object_get(root, "input")) < 0) return -1;
    json_t *qs = json_object_get(root, "questions");
    if (!json_is_array(qs)) return bad(ps->e, "questions", "questions %s", qs ? "must be a list" : "is missing");
    size_t n = json_array_size(qs);
    if (n < 1 || n > SQUAD_DAPI_MAX_QUESTIONS)
        return bad(ps->e, "questions", "questions has %zu entries; between 1 and %d are allowed", n,
                   SQUAD_DAPI_MAX_QUESTIONS);
    ps->n_q = (int)n;
    ps->qs = calloc(n, sizeof *ps->qs);
    ps->blocks = calloc(n, sizeof *ps->blocks);
    if (!ps->qs || !ps->blocks) return oom(ps->e);
    for (size_t i = 0; i < n; i++)
        if (decisions_question(ps, json_array_get(qs, i), (int)i) < 0) return -1;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * System One (section B)
 * ------------------------------------------------------------------------------------------- */

/* The model field: absent, the served name, jev-latest, jev-* (the router decides), a specialist. */
static int systemone_model(parse_state *ps, json_t *model, int *spec) {
    *spec = -1;
    if (!model) return 0;
    if (!json_is_string(model)) return bad(ps->e, "model", "model must be a string");
    const char *m = json_string_value(model);
    if (find_model(ps->ctx, m, spec) || !strncmp(m, "jev-", 4)) return 0; /* a specialist's name first */
    return not_found(ps, m);
}

static int systemone_question(parse_state *ps, const char *id, json_t *q, int qi) {
    static const char *const KEYS[] = {"type", "instructions", "criteria", NULL};
    dapi_question *dq = &ps->qs[qi];
    squad_buf *b = &ps->blocks[qi];
    char where[160], param[192];
    FIELD(where, "questions.%.120s", id);
    if (!json_is_object(q)) return bad(ps->e, where, "%s must be an object", where);
    dq->q = q;
    dq->id = id;
    json_t *type = json_object_get(q, "type");
    FIELD(param, "%s.type", where);
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!strcmp(t, "noul")) dq->kind = Q_NOUL;
    else if (!strcmp(t, "choice")) dq->kind = Q_SO_CHOICE;
    else if (!strcmp(t, "score")) dq->kind = Q_SO_SCORE;
    else return bad(ps->e, param, "%s must be \"noul\", \"choice\" or \"score\"", param);
    if (only_keys(ps, q, where, KEYS) < 0) return -1;
    squad_buf instr = {0};
    json_t *iv = get(q, "instructions");
    int rc = iv ? put_text(ps, &instr, iv) : 0;
    if (rc == 0) rc = block_start(ps, b, &instr);
    free(instr.s);
    if (rc < 0) return -1;
    json_t *crit = get(q, "criteria");
    FIELD(param, "%s.criteria", where);
    dq->opts = crit;
    if (dq->kind == Q_NOUL) {
        static const char *const NOUL_KEYS[] = {"true", "false", NULL};
        if (crit && !json_is_object(crit)) return bad(ps->e, param, "%s must be an object", param);
        if (crit && only_keys(ps, crit, param, NOUL_KEYS) < 0) return -1;
        for (int side = 0; side < 2; side++) {
            const char *key = side ? "false" : "true";
            json_t *d = crit ? get(crit, key) : NULL;
            char dp[208];
            FIELD(dp, "%s.%s", param, key);
            if (d && !json_is_string(d)) return bad(ps->e, dp, "%s must be a string", dp);
            if (d && json_string_length(d) &&
                option_line(ps, b, side ? "no" : "yes", json_string_value(d), json_string_length(d), NULL) < 0)
                return -1;
        }
        dq->n_opts = N_NOUL;
        memcpy(dq->labels, ps->ctx->noul, sizeof ps->ctx->noul);
        return block_end(ps, b, CLOSE_NOUL);
    }
    if (dq->kind == Q_SO_CHOICE) {
        if (!json_is_object(crit))
            return bad(ps->e, param, "%s %s", param, crit ? "must be an object (name -> description)" : "is missing");
        size_t n = json_object_size(crit);
        if (n < 1 || n > SQUAD_DAPI_MAX_CHOICES)
            return bad(ps->e, param, "%s has %zu entries; between 1 and %d are allowed", param, n,
                       SQUAD_DAPI_MAX_CHOICES);
        const char *name;
        json_t *d;
        int j = 0;
        json_object_foreach(crit, name, d) {
            char dp[208], label[2] = {(char)('A' + j), 0};
            FIELD(dp, "%s.%.60s", param, name);
            if (!json_is_null(d) && !json_is_string(d)) return bad(ps->e, dp, "%s must be a string or null", dp);
            if (option_line(ps, b, label, name, strlen(name), d) < 0) return -1;
            j++;
        }
        dq->n_opts = (int)n;
        memcpy(dq->labels, ps->ctx->letters, n * sizeof(int32_t));
        return block_end(ps, b, CLOSE_LETTER);
    }
    if (!json_is_array(crit))
        return bad(ps->e, param, "%s %s", param, crit ? "must be a list of level texts" : "is missing");
    size_t n = json_array_size(crit);
    if (n < 2 || n > SQUAD_DAPI_MAX_LEVELS)
        return bad(ps->e, param, "%s has %zu entries; between 2 and %d are allowed", param, n, SQUAD_DAPI_MAX_LEVELS);
    for (size_t j = 0; j < n; j++) {
        json_t *d = json_array_get(crit, j);
        char dp[208], label[2] = {(char)('0' + j), 0};
        FIELD(dp, "%s[%zu]", param, j);
        if (!json_is_null(d) && !json_is_string(d)) return bad(ps->e, dp, "%s must be a string or null", dp);
        const char *text = json_is_string(d) ? json_string_value(d) : "";
        size_t tn = json_is_string(d) ? json_string_length(d) : 0;
        if (option_line(ps, b, label, text, tn, NULL) < 0) return -1;
    }
    dq->n_opts = (int)n;
    memcpy(dq->labels, ps->ctx->digits, n * sizeof(int32_t));
    return block_end(ps, b, CLOSE_NUMBER);
}

static int systemone_parse(parse_state *ps, json_t *root, int *spec) {
    static const char *const KEYS[] = {"state", "model", "instructions", "questions", NULL};
    if (only_keys(ps, root, "", KEYS) < 0) return -1;
    if (systemone_model(ps, get(root, "model"), spec) < 0) return -1;
    json_t *instr = get(root, "instructions");
    if (instr && !json_is_string(instr) && !json_is_object(instr) && !json_is_array(instr))
        return bad(ps->e, "instructions", "instructions must be a string, an object, an array or null");
    if (instr && put_text(ps, &ps->sys, instr) < 0) return -1;
    json_t *qs = json_object_get(root, "questions");
    if (!json_is_object(qs))
        return bad(ps->e, "questions", "questions %s", qs ? "must be an object (id -> question)" : "is missing");
    size_t n = json_object_size(qs);
    if (n < 1 || n > SQUAD_DAPI_MAX_QUESTIONS)
        return bad(ps->e, "questions", "questions has %zu entries; between 1 and %d are allowed", n,
                   SQUAD_DAPI_MAX_QUESTIONS);
    ps->n_q = (int)n;
    ps->qs = calloc(n, sizeof *ps->qs);
    ps->blocks = calloc(n, sizeof *ps->blocks);
    if (!ps->qs || !ps->blocks) return oom(ps->e);
    const char *id;
    json_t *q;
    int i = 0;
    json_object_foreach(qs, id, q) {
        if (systemone_question(ps, id, q, i) < 0) return -1;
        i++;
    }
    /* The state may be any JSON value but null (section B): absent and null are a 400. */
    json_t *state = get(root, "state");
    if (!state) return bad(ps->e, "state", "state is missing (a string, object, array, number or boolean)");
    return put_text(ps, &ps->state, state);
}

/* ---------------------------------------------------------------------------------------------
 * Rows
 * ------------------------------------------------------------------------------------------- */

void squad_dapi_req_free(squad_dapi_req *r) {
    if (!r) return;
    struct squad_dapi_store *s = r->store;
    if (s) {
        for (int i = 0; i < r->n_rows; i++) {
            if (s->ids) free(s->ids[i]);
            if (s->suffix) free(s->suffix[i]);
        }
        free(s->ids);
        free(s->suffix);
        free(s->slots);
        free(s->nopts);
        free(s->qs);
        free(s->prefix_text);
        free(s->model);
        json_decref(s->root);
        free(s);
    }
    free(r->rows);
    free(r);
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Token positions of the breakpoints: for each, the leading prefix ids the text before it fixes. */
static int breakpoints(parse_state *ps, squad_dapi_req *r, const squad_idvec *prefix, size_t sys_n) {
    size_t sys_len = sys_n ? strlen(SYSTEM_OPEN) + sys_n + strlen(SYSTEM_CLOSE) : 0;
    for (int k = 0; k < ps->n_bp; k++) {
        size_t cut = ps->bp_in_sys[k] ? strlen(SYSTEM_OPEN) + ps->bp_off[k]
                                       : sys_len + strlen(USER_OPEN) + ps->bp_off[k];
        tok_builder b = {ps->ctx->tok, {0}, {0}};
        squad_err err = {0};
        if (render_prefix(&b, ps->sys.s, sys_n, ps->state.s, ps->state.n, cut, &err) < 0) {
            tb_free(&b);
            return from_err(ps->e, &err);
        }
        size_t n = 0;
        while (n < b.ids.n && n < prefix->n && b.ids.v[n] == prefix->v[n]) n++;
        tb_free(&b);
        r->breakpoints[r->n_breakpoints++] = (int)n;
    }
    qsort(r->breakpoints, (size_t)r->n_breakpoints, sizeof(int), cmp_int);
    int k = 0; /* drop duplicates and empty positions */
    for (int i = 0; i < r->n_breakpoints; i++)
        if (r->breakpoints[i] > 0 && (k == 0 || r->breakpoints[k - 1] != r->breakpoints[i]))
            r->breakpoints[k++] = r->breakpoints[i];
    r->n_breakpoints = k;
    return 0;
}

/* The prefix text: SYSTEM_OPEN sys SYSTEM_CLOSE (when sys is not empty) USER_OPEN state STATE_END. */
static char *prefix_text(const parse_state *ps) {
    squad_buf t = {0};
    if (ps->sys.n) {
        squad_buf_puts(&t, SYSTEM_OPEN);
        squad_buf_put(&t, ps->sys.s, ps->sys.n);
        squad_buf_puts(&t, SYSTEM_CLOSE);
    }
    squad_buf_puts(&t, USER_OPEN);
    squad_buf_put(&t, ps->state.s, ps->state.n);
    squad_buf_puts(&t, STATE_END);
    return squad_buf_take(&t, NULL);
}

static int build_rows(parse_state *ps, squad_dapi_req *r) {
    const squad_dapi_ctx *c = ps->ctx;
    struct squad_dapi_store *s = r->store;
    tok_builder b = {c->tok, {0}, {0}};
    squad_err err = {0};
    int rc = -1;
    const char *state_field = r->api == SQUAD_DAPI_DECISIONS ? "input" : "state";
    if (squad_buf_put(&ps->sys, "", 0) < 0 || squad_buf_put(&ps->state, "", 0) < 0) return oom(ps->e);
    s->prefix_text = prefix_text(ps);
    r->prefix_text = s->prefix_text;
    if (!s->prefix_text) return oom(ps->e);
    if (render_prefix(&b, ps->sys.s, ps->sys.n, ps->state.s, ps->state.n, SIZE_MAX, &err) < 0) {
        rc = from_err(ps->e, &err);
        goto done;
    }
    size_t state_len = b.ids.n;
    if (c->max_tokens && state_len >= (size_t)c->max_tokens) {
        rc = bad(ps->e, state_field, "%s renders as %zu tokens; the model supports at most %d tokens per row",
                 state_field, state_len, c->max_tokens);
        goto done;
    }
    if (state_len > INT32_MAX / 2) {
        rc = bad(ps->e, state_field, "%s is too long", state_field);
        goto done;
    }
    r->state_len = (int)state_len;
    if (breakpoints(ps, r, &b.ids, ps->sys.n) < 0) goto done;
    int n = ps->n_q;
    r->rows = calloc((size_t)n, sizeof *r->rows);
    s->ids = calloc((size_t)n, sizeof *s->ids);
    s->suffix = calloc((size_t)n, sizeof *s->suffix);
    s->slots = calloc((size_t)n, sizeof *s->slots);
    s->nopts = calloc((size_t)n, sizeof *s->nopts);
    if (!r->rows || !s->ids || !s->suffix || !s->slots || !s->nopts) {
        rc = oom(ps->e);
        goto done;
    }
    r->n_rows = n;
    r->suffix_texts = (const char *const *)s->suffix;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const dapi_question *dq = &ps->qs[i];
        squad_buf suf = {0};
        squad_buf_put(&suf, ps->blocks[i].s, ps->blocks[i].n);
        squad_buf_puts(&suf, GENERATION_PROMPT);
        s->suffix[i] = squad_buf_take(&suf, NULL);
        if (!s->suffix[i]) {
            rc = oom(ps->e);
            goto done;
        }
        b.ids.n = state_len; /* every row starts with the prefix */
        if (tb_plain(&b, ps->blocks[i].s, ps->blocks[i].n, &err) < 0 ||
            tb_template(&b, GENERATION_PROMPT, strlen(GENERATION_PROMPT), &err) < 0 || tb_flush(&b, &err) < 0) {
            rc = from_err(ps->e, &err);
            goto done;
        }
        char param[160];
        if (r->api == SQUAD_DAPI_DECISIONS) FIELD(param, "questions[%d]", i);
        else FIELD(param, "questions.%.120s", dq->id);
        if (c->max_tokens && b.ids.n > (size_t)c->max_tokens) {
            rc = bad(ps->e, param, "%s makes a row of %zu tokens; the model supports at most %d tokens per row", param,
                     b.ids.n, c->max_tokens);
            goto done;
        }
        total += b.ids.n;
        if (total > MAX_TOTAL_IDS) {
            rc = bad(ps->e, "questions",
                     "the request is too large: its rows would hold more than %zu tokens (each repeats the "
                     "%zu-token state)",
                     MAX_TOTAL_IDS, state_len);
            goto done;
        }
        if (!(s->ids[i] = malloc(b.ids.n * sizeof(int32_t)))) {
            rc = oom(ps->e);
            goto done;
        }
        memcpy(s->ids[i], b.ids.v, b.ids.n * sizeof(int32_t));
        s->slots[i] = (int32_t)b.ids.n - 1;
        s->nopts[i] = dq->n_opts;
        squad_row *row = &r->rows[i];
        row->ids = s->ids[i];
        row->n_ids = (int)b.ids.n;
        row->slots = &s->slots[i];
        row->nopts = &s->nopts[i];
        row->n_slots = 1;
        row->letters = dq->labels;
        row->n_letters = dq->n_opts;
        row->state_len = (int)state_len;
    }
    rc = 0;
done:
    tb_free(&b);
    return rc;
}

static void parse_state_free(parse_state *ps) {
    free(ps->sys.s);
    free(ps->state.s);
    if (ps->blocks)
        for (int i = 0; i < ps->n_q; i++) free(ps->blocks[i].s);
    free(ps->blocks);
    free(ps->qs); /* moved into the request on success (then NULL here) */
}

int squad_dapi_parse(const squad_dapi_ctx *c, squad_dapi api, const char *body, size_t len, squad_dapi_req **out,
                     squad_dapi_error *e) {
    *out = NULL;
    if (api < 0 || api >= SQUAD_DAPI_COUNT) {
        squad_dapi_error_set(e, 500, NULL, "no such decision API");
        return -1;
    }
    if (c->disabled[api]) {
        squad_dapi_error_set(e, 501, NULL, "this endpoint is disabled for this model's tokenizer: %s", c->disabled[api]);
        return -1;
    }
    size_t badu = squad_utf8_invalid_offset(body, len);
    if (badu < len) return bad(e, NULL, "the body is not valid UTF-8 (byte %zu)", badu);
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_duplicate_key)
            return bad(e, NULL, "the body has a duplicate key (line %d, column %d): %s", jerr.line, jerr.column,
                       jerr.text);
        return bad(e, NULL, "the body is not valid JSON (line %d, column %d): %s", jerr.line, jerr.column, jerr.text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return bad(e, NULL, "the body must be a JSON object");
    }
    parse_state ps;
    memset(&ps, 0, sizeof ps);
    ps.ctx = c;
    ps.e = e;
    int spec = -1, rc;
    squad_dapi_req *r = NULL;
    rc = api == SQUAD_DAPI_DECISIONS ? decisions_parse(&ps, root, &spec) : systemone_parse(&ps, root, &spec);
    if (rc == 0) {
        r = calloc(1, sizeof *r);
        if (r) r->store = calloc(1, sizeof *r->store);
        if (!r || !r->store) rc = oom(e);
    }
    if (rc == 0) {
        r->api = api;
        r->specialist = spec;
        r->store->root = root;
        json_incref(root);
        r->store->qs = ps.qs;
        ps.qs = NULL;
        json_t *model = get(root, "model");
        r->store->model = strdup(json_is_string(model) ? json_string_value(model) : c->served);
        r->model = r->store->model;
        if (!r->model) rc = oom(e);
    }
    if (rc == 0) {
        /* The store's question array must stay valid for the rows' letters. */
        ps.qs = r->store->qs;
        rc = build_rows(&ps, r);
        ps.qs = NULL;
    }
    parse_state_free(&ps);
    json_decref(root);
    if (rc < 0) {
        squad_dapi_req_free(r);
        return -1;
    }
    *out = r;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Responses (sections A, B, D)
 * ------------------------------------------------------------------------------------------- */

/* A probability as the float it is, written with the float's shortest digits. */
static json_t *prob(double p) {
    float f = (float)p;
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        FIELD(buf, "%.*g", digits, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}

/* The slot's label mass (1 without the vocabulary figures) and whether the vocabulary's argmax is
 * one of the row's labels (true without them). */
static double label_mass(const squad_result *res) {
    if (!res->has_vocab) return 1.0;
    double m = res->label_mass[0];
    return isfinite(m) ? (m < 0 ? 0 : m > 1 ? 1 : m) : 0;
}

static int argmax_is_label(const squad_row *row, const squad_result *res) {
    if (!res->has_vocab) return 1;
    for (int i = 0; i < row->n_letters; i++)
        if (row->letters[i] == res->top_token[0]) return 1;
    return 0;
}

/* json_object_set_new that remembers a failure. */
static void put(json_t *obj, const char *key, json_t *v, int *failed) {
    if (!v || json_object_set_new(obj, key, v) < 0) *failed = 1;
}

static void push(json_t *arr, json_t *v, int *failed) {
    if (!v || json_array_append_new(arr, v) < 0) *failed = 1;
}

static json_t *name_of(const dapi_question *dq) {
    json_t *n = get(dq->q, "name");
    return n ? json_incref(n) : json_null();
}

static json_t *decisions_answer(const dapi_question *dq, const squad_result *res, int *failed) {
    const float *p = res->probs[0];
    json_t *a = json_object();
    if (!a) {
        *failed = 1;
        return NULL;
    }
    static const char *const TYPES[] = {"predicate", "choice", "score"};
    put(a, "type", json_string(TYPES[dq->kind]), failed);
    put(a, "name", name_of(dq), failed);
    if (dq->kind == Q_PREDICATE) {
        put(a, "probability", prob(p[1]), failed);
        return a;
    }
    int top = 0;
    for (int i = 1; i < dq->n_opts; i++)
        if (p[i] > p[top]) top = i;
    json_t *probs = json_array();
    if (!probs) *failed = 1;
    double expect = 0;
    for (int i = 0; i < dq->n_opts && probs; i++) {
        json_t *o = json_array_get(dq->opts, (size_t)i), *e = json_object();
        if (!e) {
            *failed = 1;
            break;
        }
        if (dq->kind == Q_CHOICE) {
            put(e, "value", json_incref(json_object_get(o, "value")), failed);
        } else {
            put(e, "value", json_integer(i), failed);
            put(e, "label", json_incref(json_object_get(o, "label")), failed);
            expect += i * (double)p[i];
        }
        put(e, "probability", prob(p[i]), failed);
        push(probs, e, failed);
    }
    if (dq->kind == Q_CHOICE) put(a, "choice", json_incref(json_object_get(json_array_get(dq->opts, (size_t)top), "value")), failed);
    else put(a, "score", json_real(expect), failed);
    put(a, "probabilities", probs, failed);
    put(a, "confidence", prob(p[top] * label_mass(res)), failed);
    return a;
}

static json_t *systemone_answer(const dapi_question *dq, const squad_result *res, int *failed) {
    const float *p = res->probs[0];
    json_t *a = json_object(), *probs = json_object();
    if (!a || !probs) {
        json_decref(a);
        json_decref(probs);
        *failed = 1;
        return NULL;
    }
    double mass = label_mass(res);
    if (dq->kind == Q_NOUL) {
        double yes = (double)p[0] + p[2], no = (double)p[1] + p[3];
        put(a, "type", json_string("noul"), failed);
        put(a, "noul", prob(yes), failed);
        put(probs, "yes", prob(yes), failed);
        put(probs, "no", prob(no), failed);
        put(a, "probabilities", probs, failed);
        put(a, "confidence", prob((yes >= no ? yes : no) * mass), failed);
        return a;
    }
    int top = 0;
    for (int i = 1; i < dq->n_opts; i++)
        if (p[i] > p[top]) top = i;
    if (dq->kind == Q_SO_CHOICE) {
        const char *name, *top_name = "";
        json_t *d;
        int i = 0;
        json_object_foreach(dq->opts, name, d) {
            if (i == top) top_name = name;
            put(probs, name, prob(p[i]), failed);
            i++;
        }
        put(a, "type", json_string("choice"), failed);
        put(a, "choice", json_string(top_name), failed);
    } else {
        json_t *legend = json_object();
        if (!legend) *failed = 1;
        double expect = 0;
        for (int i = 0; i < dq->n_opts && legend; i++) {
            char key[4];
            FIELD(key, "%d", i);
            json_t *d = json_array_get(dq->opts, (size_t)i);
            put(legend, key, json_is_string(d) ? json_incref(d) : json_string(""), failed);
            put(probs, key, prob(p[i]), failed);
            expect += i * (double)p[i];
        }
        put(a, "type", json_string("score"), failed);
        put(a, "score", json_real(expect), failed);
        put(a, "legend", legend, failed);
    }
    put(a, "probabilities", probs, failed);
    put(a, "confidence", prob(p[top] * mass), failed);
    return a;
}

/* "decision-" and 24 hex digits from the kernel's random source (the clock when that fails). */
static void decision_id(char *out, size_t cap) {
    unsigned char r[12];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t a = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec, b = (uint64_t)(uintptr_t)out;
        for (int i = 0; i < 8; i++) r[i] = (unsigned char)(a >> (8 * i));
        for (int i = 0; i < 4; i++) r[8 + i] = (unsigned char)(b >> (8 * i));
    }
    int k = snprintf(out, cap, "decision-");
    for (size_t i = 0; i < sizeof r && (size_t)k + 2 < cap; i++) k += snprintf(out + k, cap - (size_t)k, "%02x", r[i]);
}

json_t *squad_dapi_respond(const squad_dapi_req *r, const squad_result *results, int from_memo, squad_err *err) {
    const struct squad_dapi_store *s = r->store;
    int failed = 0;
    long long input = 0, cached = 0, written = 0;
    for (int i = 0; i < r->n_rows; i++) {
        input += r->rows[i].n_ids;
        cached += results[i].reused;
        written += results[i].cache_written;
        if (results[i].n_slots < 1) {
            squad_fail(err, SQUAD_E_INVALID, "result %d has no slot", i);
            return NULL;
        }
    }
    if (from_memo) cached = input, written = 0;
    json_t *body = json_object();
    if (!body) goto nomem;
    if (r->api == SQUAD_DAPI_DECISIONS) {
        json_t *answers = json_array(), *usage = json_object();
        put(body, "model", json_string(r->model), &failed);
        put(body, "answers", answers, &failed);
        for (int i = 0; i < r->n_rows && answers; i++) push(answers, decisions_answer(&s->qs[i], &results[i], &failed), &failed);
        put(body, "usage", usage, &failed);
        if (usage) {
            put(usage, "input_tokens", json_integer(input), &failed);
            put(usage, "input_tokens_details", json_pack("{s:I, s:I}", "cached_tokens", (json_int_t)cached,
                                                         "cache_write_tokens", (json_int_t)written), &failed);
            put(usage, "output_tokens", json_integer(r->n_rows), &failed);
            put(usage, "output_tokens_details", json_pack("{s:i}", "reasoning_tokens", 0), &failed);
            put(usage, "total_tokens", json_integer(input + r->n_rows), &failed);
        }
    } else {
        char id[64];
        decision_id(id, sizeof id);
        json_t *answers = json_object(), *diag = json_object();
        put(body, "id", json_string(id), &failed);
        put(body, "object", json_string("structured_decision"), &failed);
        put(body, "created", json_integer((json_int_t)time(NULL)), &failed);
        put(body, "model", json_string(r->model), &failed);
        put(body, "answers", answers, &failed);
        for (int i = 0; i < r->n_rows && answers && diag; i++) {
            put(answers, s->qs[i].id, systemone_answer(&s->qs[i], &results[i], &failed), &failed);
            put(diag, s->qs[i].id,
                json_pack("{s:o, s:b}", "label_mass", prob(label_mass(&results[i])), "argmax_is_label",
                          argmax_is_label(&r->rows[i], &results[i])),
                &failed);
        }
        put(body, "usage", json_pack("{s:I, s:i}", "input_tokens", (json_int_t)input, "output_tokens", r->n_rows),
            &failed);
        put(body, "diagnostics", diag, &failed);
    }
    if (!failed) return body;
    json_decref(body);
nomem:
    squad_fail(err, SQUAD_E_NOMEM, "out of memory (response)");
    return NULL;
}
