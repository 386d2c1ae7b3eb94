/*
 * decisions.c — the decision APIs' shared parts (decisions.h; the contract is
 * docs/decisions-api.md, sections A to F): errors, the context and its label tokens, the token
 * builder that renders section C's chat markup, the parsing helpers both APIs use, the rows built
 * from a parse, and the response's frame. Each API's own body and answers are in
 * decisions_openai.c and decisions_systemone.c (decisions_internal.h joins them).
 *
 * Design:
 * - Parsing and validation happen in one pass over the jansson tree; the first problem found
 *   becomes a squad_dapi_error whose message and param name the field by its JSON path.
 * - A request is first reduced to plain strings: the system message, the state, and per question
 *   its block (instructions line, option lines, closing line). Everything that came from the
 *   request is text; only the chat markup around it is template text.
 * - Rendering feeds segments to the token builder (token_builder.h): template segments have their
 *   added tokens (<|im_start|> ...) turned into ids, the text between them is collected and encoded
 *   in one piece with added tokens disabled. The builder is flushed at the end of the prefix, so the state's
 *   tokens never depend on the questions and every row shares ids[0, state_len).
 * - Labels: the answer slot is the last token of the generation prompt, whose text after its last
 *   special token is "\n\n"; a label's token is the one token that encoding "\n\n" + label adds to
 *   encoding "\n\n". The context finds them once; an API whose labels are not distinct single
 *   tokens is disabled with the reason.
 * - A prompt_cache_breakpoint's position is the number of leading tokens of the prefix that the
 *   text before the breakpoint fixes: the common prefix of the prefix's ids and the ids of the
 *   prefix cut at that point (a token that straddles the cut is not counted).
 * - Responses are built from the request tree kept in the parsed request (names, typed values,
 *   question ids) and the rows' squad_result, once per call: the fields a caller fills per call
 *   (squad_dapi_fields) are its to give.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "decisions_internal.h"
#include "json_text.h"
#include "rows.h"
#include "token_builder.h"

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

const char *const DAPI_NOUL_LABELS[N_NOUL] = {"yes", "no", "Yes", "No"};

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

/* A 400 naming param; returns -1 so callers can `return dapi_bad(...)`. */
int dapi_bad(squad_dapi_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, 400, param, fmt, ap);
    va_end(ap);
    return -1;
}

int dapi_from_err(squad_dapi_error *e, const squad_err *err) {
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
 * The prefix
 * ------------------------------------------------------------------------------------------- */

/* The images standing in the state: images[k] at byte image_off[k] of the state's text (ascending). */
typedef struct prefix_images {
    squad_row_image *images;
    const size_t *off;
    int n;
    int32_t pad;  /* the <|image_pad|> id */
    int set_pos;  /* record each run's first index in images[k].pos */
} prefix_images;

/* One image: <|vision_start|>, its run of pad ids, <|vision_end|>. */
static int render_image(token_builder *b, squad_row_image *img, const prefix_images *pi, squad_err *err) {
    int rc = token_builder_template(b, SQUAD_VISION_START_TOKEN, strlen(SQUAD_VISION_START_TOKEN), err);
    if (rc >= 0) rc = token_builder_flush(b, err);
    if (rc < 0) return rc;
    if (b->ids.n > (size_t)(INT32_MAX / 2)) return squad_fail(err, SQUAD_E_INVALID, "the state is too long");
    if (pi->set_pos) img->pos = (int)b->ids.n;
    for (int k = 0; k < img->tokens && rc >= 0; k++) rc = squad_idvec_push(&b->ids, pi->pad, err);
    if (rc >= 0) rc = token_builder_template(b, SQUAD_VISION_END_TOKEN, strlen(SQUAD_VISION_END_TOKEN), err);
    return rc;
}

/* The prefix, rendered up to `cut` bytes of its text (SIZE_MAX: all of it), then flushed. Its text
 * is SYSTEM_OPEN sys SYSTEM_CLOSE (when sys is not empty), USER_OPEN state STATE_END, with each image's
 * markup at its offset in the state (an image at the cut or past it is left out). */
static int render_prefix(token_builder *b, const char *sys, size_t sys_n, const char *state, size_t state_n,
                         const prefix_images *pi, size_t cut, squad_err *err) {
    struct {
        int plain;
        const char *s;
        size_t n;
    } seg[6];
    int k = 0, state_seg = -1;
    if (sys_n) {
        seg[k].plain = 0, seg[k].s = SYSTEM_OPEN, seg[k].n = strlen(SYSTEM_OPEN), k++;
        seg[k].plain = 1, seg[k].s = sys, seg[k].n = sys_n, k++;
        seg[k].plain = 0, seg[k].s = SYSTEM_CLOSE, seg[k].n = strlen(SYSTEM_CLOSE), k++;
    }
    seg[k].plain = 0, seg[k].s = USER_OPEN, seg[k].n = strlen(USER_OPEN), k++;
    state_seg = k;
    seg[k].plain = 1, seg[k].s = state, seg[k].n = state_n, k++;
    seg[k].plain = 0, seg[k].s = STATE_END, seg[k].n = strlen(STATE_END), k++;
    size_t at = 0;
    for (int i = 0; i < k && at < cut; i++) {
        size_t n = seg[i].n < cut - at ? seg[i].n : cut - at;
        int rc = 0;
        if (i == state_seg && pi && pi->n) { /* the state's text in pieces, its images between them */
            size_t done = 0;
            for (int m = 0; m < pi->n && pi->off[m] < cut - at && rc >= 0; m++) { /* at the state's end too */
                rc = token_builder_text(b, state + done, pi->off[m] - done, err);
                if (rc >= 0) rc = render_image(b, &pi->images[m], pi, err);
                done = pi->off[m];
            }
            if (rc >= 0) rc = token_builder_text(b, state + done, n - done, err);
        } else {
            rc = seg[i].plain ? token_builder_text(b, seg[i].s, n, err) : token_builder_template(b, seg[i].s, n, err);
        }
        if (rc < 0) return rc;
        at += n;
    }
    return token_builder_flush(b, err);
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
    if (!why && !(err && err->code)) why = find_labels(tok, DAPI_NOUL_LABELS, N_NOUL, c->noul, err);
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



int dapi_oom(squad_dapi_error *e) {
    squad_dapi_error_set(e, 500, NULL, "out of memory");
    return -1;
}

/* Checks that obj has only keys from the NULL-terminated list; names the first other one. */
int dapi_only_keys(parse_state *ps, json_t *obj, const char *where, const char *const *keys) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        int ok = 0;
        for (int i = 0; keys[i] && !ok; i++) ok = !strcmp(k, keys[i]);
        if (!ok) {
            char param[128];
            FIELD(param, "%s%s%s", where, where[0] ? "." : "", k);
            return dapi_bad(ps->e, param, "unknown field \"%s\"%s%s", param, where[0] ? " in " : "", where);
        }
    }
    return 0;
}

/* obj[key] with absent and null the same (NULL). */
json_t *dapi_get(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* Appends v's text: a string as it is, anything else as its JSON text (section E). */
int dapi_put_text(parse_state *ps, squad_buf *b, json_t *v) {
    if (json_is_string(v)) return squad_buf_put(b, json_string_value(v), json_string_length(v)) < 0 ? dapi_oom(ps->e) : 0;
    squad_err err = {0};
    size_t n;
    char *t = squad_json_text(v, &n, &err);
    if (!t) return dapi_from_err(ps->e, &err);
    int rc = squad_buf_put(b, t, n);
    free(t);
    return rc < 0 ? dapi_oom(ps->e) : 0;
}



/* An option line: "{label}: {name}" or "{label}: {name} - {description}". */
int dapi_option_line(parse_state *ps, squad_buf *b, const char *label, const char *name, size_t name_n,
                       json_t *desc) {
    if (squad_buf_puts(b, PART_JOIN) < 0 || squad_buf_puts(b, label) < 0 || squad_buf_puts(b, ": ") < 0 || squad_buf_put(b, name, name_n) < 0)
        return dapi_oom(ps->e);
    if (json_is_string(desc) && json_string_length(desc) &&
        (squad_buf_puts(b, " - ") < 0 || squad_buf_put(b, json_string_value(desc), json_string_length(desc)) < 0))
        return dapi_oom(ps->e);
    return 0;
}

/* Starts a block with "Question: {instructions}" when they are not empty. */
int dapi_block_start(parse_state *ps, squad_buf *b, const squad_buf *instr) {
    if (instr->n && (squad_buf_puts(b, "Question: ") < 0 || squad_buf_put(b, instr->s, instr->n) < 0)) return dapi_oom(ps->e);
    return 0;
}

/* Closes a block; when it has no instructions the first option line lost its leading newline. */
int dapi_block_end(parse_state *ps, squad_buf *b, const char *closing) {
    if (squad_buf_puts(b, PART_JOIN) < 0 || squad_buf_puts(b, closing) < 0 || squad_buf_put(b, "", 0) < 0) return dapi_oom(ps->e);
    /* Lines are joined by "\n": when instructions were empty the block starts with a join. */
    if (b->s[0] == '\n') {
        memmove(b->s, b->s + 1, b->n);
        b->n--;
    }
    return 0;
}


/* Model names: the served name or a specialist's (index in *spec, -1 for the served name). */
int dapi_find_model(const squad_dapi_ctx *c, const char *name, int *spec) {
    *spec = -1;
    if (!strcmp(name, c->served)) return 1;
    for (int i = 0; i < c->n_specialists; i++)
        if (!strcmp(name, c->specialists[i])) {
            *spec = i;
            return 1;
        }
    return 0;
}

int dapi_not_found(parse_state *ps, const char *name) {
    squad_dapi_error_set(ps->e, 404, "model", "the model \"%.200s\" does not exist (this server serves \"%.200s\")",
                         name, ps->ctx->served);
    return -1;
}


/* ---------------------------------------------------------------------------------------------
 * Rows
 * ------------------------------------------------------------------------------------------- */

void squad_dapi_req_free(squad_dapi_req *r) {
    if (!r) return;
    struct squad_dapi_store *s = r->store;
    if (s) {
        for (int i = 0; i < s->n_images; i++)
            if (s->image_loader.release) s->image_loader.release(s->image_loader.ctx, &s->images[i]);
        free(s->images);
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
static int breakpoints(parse_state *ps, squad_dapi_req *r, const squad_idvec *prefix, size_t sys_n,
                       const prefix_images *pi) {
    size_t sys_len = sys_n ? strlen(SYSTEM_OPEN) + sys_n + strlen(SYSTEM_CLOSE) : 0;
    for (int k = 0; k < ps->n_bp; k++) {
        size_t cut = ps->bp_in_sys[k] ? strlen(SYSTEM_OPEN) + ps->bp_off[k]
                                       : sys_len + strlen(USER_OPEN) + ps->bp_off[k];
        token_builder b = {ps->ctx->tok, {0}, {0}};
        squad_err err = {0};
        if (render_prefix(&b, ps->sys.s, sys_n, ps->state.s, ps->state.n, pi, cut, &err) < 0) {
            token_builder_free(&b);
            return dapi_from_err(ps->e, &err);
        }
        size_t n = 0;
        while (n < b.ids.n && n < prefix->n && b.ids.v[n] == prefix->v[n]) n++;
        token_builder_free(&b);
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
    size_t done = 0;
    for (int m = 0; m < ps->n_images; m++) { /* each image's markup where it stands, its pads written out */
        squad_buf_put(&t, ps->state.s + done, ps->image_off[m] - done);
        done = ps->image_off[m];
        squad_buf_puts(&t, SQUAD_VISION_START_TOKEN);
        for (int k = 0; k < ps->images[m].tokens; k++) squad_buf_puts(&t, SQUAD_IMAGE_PAD_TOKEN);
        squad_buf_puts(&t, SQUAD_VISION_END_TOKEN);
    }
    squad_buf_put(&t, ps->state.s + done, ps->state.n - done);
    squad_buf_puts(&t, STATE_END);
    return squad_buf_take(&t, NULL);
}

static int build_rows(parse_state *ps, squad_dapi_req *r) {
    const squad_dapi_ctx *c = ps->ctx;
    struct squad_dapi_store *s = r->store;
    token_builder b = {c->tok, {0}, {0}};
    squad_err err = {0};
    int rc = -1;
    const char *state_field = r->api == SQUAD_DAPI_DECISIONS ? "input" : "state";
    if (squad_buf_put(&ps->sys, "", 0) < 0 || squad_buf_put(&ps->state, "", 0) < 0) return dapi_oom(ps->e);
    s->prefix_text = prefix_text(ps);
    r->prefix_text = s->prefix_text;
    if (!s->prefix_text) return dapi_oom(ps->e);
    /* the images move into the request's store now: it releases them from here on */
    if (ps->n_images) {
        s->images = malloc((size_t)ps->n_images * sizeof *s->images);
        if (!s->images) return dapi_oom(ps->e);
        memcpy(s->images, ps->images, (size_t)ps->n_images * sizeof *s->images);
        s->n_images = ps->n_images;
        s->image_loader = *ps->loader;
        ps->n_images = 0;
    }
    prefix_images pi = {s->images, ps->image_off, s->n_images, squad_tokenizer_token_id(c->tok, SQUAD_IMAGE_PAD_TOKEN), 1};
    if (render_prefix(&b, ps->sys.s, ps->sys.n, ps->state.s, ps->state.n, &pi, SIZE_MAX, &err) < 0) {
        rc = dapi_from_err(ps->e, &err);
        goto done;
    }
    pi.set_pos = 0;
    size_t state_len = b.ids.n;
    if (c->max_tokens && state_len >= (size_t)c->max_tokens) {
        rc = dapi_bad(ps->e, state_field, "%s renders as %zu tokens" SQUAD_ROW_TOO_LONG "%d tokens",
                 state_field, state_len, c->max_tokens);
        goto done;
    }
    if (state_len > INT32_MAX / 2) {
        rc = dapi_bad(ps->e, state_field, "%s is too long", state_field);
        goto done;
    }
    r->state_len = (int)state_len;
    if (breakpoints(ps, r, &b.ids, ps->sys.n, &pi) < 0) goto done;
    int n = ps->n_q;
    r->rows = calloc((size_t)n, sizeof *r->rows);
    s->ids = calloc((size_t)n, sizeof *s->ids);
    s->suffix = calloc((size_t)n, sizeof *s->suffix);
    s->slots = calloc((size_t)n, sizeof *s->slots);
    s->nopts = calloc((size_t)n, sizeof *s->nopts);
    if (!r->rows || !s->ids || !s->suffix || !s->slots || !s->nopts) {
        rc = dapi_oom(ps->e);
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
            rc = dapi_oom(ps->e);
            goto done;
        }
        b.ids.n = state_len; /* every row starts with the prefix */
        if (token_builder_text(&b, ps->blocks[i].s, ps->blocks[i].n, &err) < 0 ||
            token_builder_template(&b, GENERATION_PROMPT, strlen(GENERATION_PROMPT), &err) < 0 ||
            token_builder_flush(&b, &err) < 0) {
            rc = dapi_from_err(ps->e, &err);
            goto done;
        }
        char param[160];
        if (r->api == SQUAD_DAPI_DECISIONS) FIELD(param, "questions[%d]", i);
        else FIELD(param, "questions.%.120s", dq->id);
        if (c->max_tokens && b.ids.n > (size_t)c->max_tokens) {
            rc = dapi_bad(ps->e, param, "%s makes a row of %zu tokens" SQUAD_ROW_TOO_LONG "%d tokens", param,
                     b.ids.n, c->max_tokens);
            goto done;
        }
        total += b.ids.n;
        if (total > MAX_TOTAL_IDS) {
            rc = dapi_bad(ps->e, "questions",
                     "the request is too large: its rows would hold more than %zu tokens (each repeats the "
                     "%zu-token state)",
                     MAX_TOTAL_IDS, state_len);
            goto done;
        }
        if (!(s->ids[i] = malloc(b.ids.n * sizeof(int32_t)))) {
            rc = dapi_oom(ps->e);
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
        row->images = s->n_images ? s->images : NULL;
        row->n_images = s->n_images;
    }
    rc = 0;
done:
    token_builder_free(&b);
    return rc;
}

static void parse_state_free(parse_state *ps) {
    for (int i = 0; i < ps->n_images; i++) ps->loader->release(ps->loader->ctx, &ps->images[i]); /* not moved */
    free(ps->sys.s);
    free(ps->state.s);
    if (ps->blocks)
        for (int i = 0; i < ps->n_q; i++) free(ps->blocks[i].s);
    free(ps->blocks);
    free(ps->qs); /* moved into the request on success (then NULL here) */
}

int squad_dapi_parse(const squad_dapi_ctx *c, squad_dapi api, const char *body, size_t len, squad_dapi_req **out,
                     squad_dapi_error *e) {
    return squad_dapi_parse_images(c, api, body, len, NULL, out, e);
}

int squad_dapi_parse_images(const squad_dapi_ctx *c, squad_dapi api, const char *body, size_t len,
                            const squad_image_loader *images, squad_dapi_req **out, squad_dapi_error *e) {
    *out = NULL;
    if (api < 0 || api >= SQUAD_DAPI_COUNT) {
        squad_dapi_error_set(e, 500, NULL, "no such decision API");
        return -1;
    }
    if (c->disabled[api]) {
        squad_dapi_error_set(e, 501, NULL, "this endpoint is disabled for this model's tokenizer: %s", c->disabled[api]);
        return -1;
    }
    squad_err rerr = {0};
    json_t *root = squad_json_read_object(body, len, "the body", &rerr); /* squad's one reader */
    if (!root) return rerr.code == SQUAD_E_NOMEM ? dapi_oom(e) : dapi_bad(e, NULL, "%s", rerr.msg);
    parse_state ps;
    memset(&ps, 0, sizeof ps);
    ps.ctx = c;
    ps.e = e;
    ps.loader = images;
    int spec = -1, rc;
    squad_dapi_req *r = NULL;
    rc = api == SQUAD_DAPI_DECISIONS ? dapi_openai_parse(&ps, root, &spec) : dapi_systemone_parse(&ps, root, &spec);
    if (rc == 0) {
        r = calloc(1, sizeof *r);
        if (r) r->store = calloc(1, sizeof *r->store);
        if (!r || !r->store) rc = dapi_oom(e);
    }
    if (rc == 0) {
        r->api = api;
        r->specialist = spec;
        r->store->root = root;
        json_incref(root);
        r->store->qs = ps.qs;
        ps.qs = NULL;
        json_t *model = dapi_get(root, "model");
        r->store->model = strdup(json_is_string(model) ? json_string_value(model) : c->served);
        r->model = r->store->model;
        if (!r->model) rc = dapi_oom(e);
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
json_t *dapi_prob(double p) {
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
double dapi_label_mass(const squad_result *res) {
    if (!res->has_vocab) return 1.0;
    double m = res->label_mass[0];
    return isfinite(m) ? (m < 0 ? 0 : m > 1 ? 1 : m) : 0;
}

int dapi_argmax_is_label(const squad_row *row, const squad_result *res) {
    if (!res->has_vocab) return 1;
    for (int i = 0; i < row->n_letters; i++)
        if (row->letters[i] == res->top_token[0]) return 1;
    return 0;
}

/* json_object_set_new that remembers a failure. */
void dapi_put(json_t *obj, const char *key, json_t *v, int *failed) {
    if (!v || json_object_set_new(obj, key, v) < 0) *failed = 1;
}

void dapi_push(json_t *arr, json_t *v, int *failed) {
    if (!v || json_array_append_new(arr, v) < 0) *failed = 1;
}

json_t *dapi_name_of(const dapi_question *dq) {
    json_t *n = dapi_get(dq->q, "name");
    return n ? json_incref(n) : json_null();
}

/* "decision-" and 24 hex digits from the kernel's random source (the clock when that fails). */
void squad_dapi_new_id(char *out, size_t cap) {
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


/* An integer field: the caller's value when it gave one, else v. */
json_t *dapi_field(json_t *given, json_int_t v) { return given ? json_incref(given) : json_integer(v); }

json_t *squad_dapi_respond(const squad_dapi_req *r, const squad_result *results, const squad_dapi_fields *f,
                           squad_err *err) {
    const squad_dapi_fields none = {0};
    if (!f) f = &none;
    dapi_totals t = {0, 0, 0};
    for (int i = 0; i < r->n_rows; i++) {
        t.input += r->rows[i].n_ids;
        t.cached += results[i].reused;
        t.written += results[i].cache_written;
        if (results[i].n_slots < 1) {
            squad_fail(err, SQUAD_E_INVALID, "result %d has no slot", i);
            return NULL;
        }
    }
    int failed = 0;
    json_t *body = r->api == SQUAD_DAPI_DECISIONS ? dapi_openai_body(r, results, f, &t, &failed)
                                                  : dapi_systemone_body(r, results, f, &t, &failed);
    if (body && !failed) return body;
    json_decref(body);
    squad_fail(err, SQUAD_E_NOMEM, "out of memory (response)");
    return NULL;
}
