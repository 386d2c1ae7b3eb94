/*
 * decisions_openai.c — OpenAI's Decisions API, POST /v1/decisions (docs/decisions-api.md section A):
 * a request body into the parse state (the input's messages and parts, with their cache
 * breakpoints; each question's block of instructions, option lines and closing line), and the rows'
 * results into the response (the answers with their probabilities and confidence, the usage).
 * decisions.c turns the parse state into rows and frames the response.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decisions_internal.h"
#include "json_text.h"

/* An input_image part (section A): its image loaded through the caller's loader, standing at b's
 * end (the state's text so far). Only data: URLs (or bare base64) in image_url: squad fetches
 * nothing, so a file_id or a remote URL is refused. */
static int decisions_image(parse_state *ps, json_t *part, const char *where, squad_buf *b, int in_sys) {
    static const char *const KEYS[] = {"type", "image_url", "detail", "file_id", NULL};
    char param[160];
    if (dapi_only_keys(ps, part, where, KEYS) < 0) return -1;
    if (in_sys)
        return dapi_bad(ps->e, where, "%s: images belong in user messages (the state), not in system or developer ones",
                        where);
    if (dapi_get(part, "file_id")) {
        FIELD(param, "%s.file_id", where);
        return dapi_bad(ps->e, param, "%s: squad keeps no files and fetches nothing; send the image as a data: URL in "
                        "image_url", param);
    }
    json_t *detail = dapi_get(part, "detail");
    FIELD(param, "%s.detail", where);
    if (detail && (!json_is_string(detail) || (strcmp(json_string_value(detail), "auto") &&
                                               strcmp(json_string_value(detail), "high") &&
                                               strcmp(json_string_value(detail), "low"))))
        return dapi_bad(ps->e, param, "%s must be \"auto\", \"low\" or \"high\"", param);
    if (detail && !strcmp(json_string_value(detail), "low"))
        return dapi_bad(ps->e, param, "%s: \"low\" (a 512x512 cap before the image processor) is not supported yet; "
                        "send \"auto\" or \"high\" (the processor's own limits), or a smaller image", param);
    json_t *url = json_object_get(part, "image_url");
    FIELD(param, "%s.image_url", where);
    if (!url || json_is_null(url)) return dapi_bad(ps->e, param, "%s is missing (a data: URL)", param);
    if (!json_is_string(url)) return dapi_bad(ps->e, param, "%s must be a string: a data: URL", param);
    if (!ps->loader || !ps->loader->load)
        return dapi_bad(ps->e, where, "%s: input_image parts are not taken here", where);
    if (ps->n_images >= SQUAD_MAX_IMAGES_PER_ROW)
        return dapi_bad(ps->e, where, "%s: a request holds at most %d images", where, SQUAD_MAX_IMAGES_PER_ROW);
    if (squad_tokenizer_token_id(ps->ctx->tok, SQUAD_IMAGE_PAD_TOKEN) < 0)
        return dapi_bad(ps->e, where, "%s: the tokenizer has no " SQUAD_IMAGE_PAD_TOKEN " token: this model takes no "
                        "images", where);
    squad_row_image *img = &ps->images[ps->n_images];
    memset(img, 0, sizeof *img);
    squad_err err = {0};
    if (ps->loader->load(ps->loader->ctx, json_string_value(url), json_string_length(url), img, &err) < 0) {
        if (err.code == SQUAD_E_NOMEM) return dapi_oom(ps->e);
        return dapi_bad(ps->e, param, "%s: %s", param, err.msg);
    }
    ps->image_off[ps->n_images++] = b->n; /* counted now, so a failure below still releases it */
    if (img->tokens < 1) return dapi_bad(ps->e, param, "%s: the image has no tokens", param);
    return 0;
}

/* One content part of a message: appends its text to b; a breakpoint records b's length after it. */
static int decisions_part(parse_state *ps, json_t *part, const char *where, squad_buf *b, int in_sys) {
    static const char *const TEXT_KEYS[] = {"type", "text", "prompt_cache_breakpoint", NULL};
    static const char *const JSON_KEYS[] = {"type", "data", NULL};
    char param[128];
    if (!json_is_object(part)) return dapi_bad(ps->e, where, "%s must be an object (a content part)", where);
    json_t *type = json_object_get(part, "type");
    FIELD(param, "%s.type", where);
    if (!json_is_string(type))
        return dapi_bad(ps->e, param, "%s must be \"input_text\", \"input_json\" or \"input_image\"", param);
    const char *t = json_string_value(type);
    if (!strcmp(t, "input_image")) return decisions_image(ps, part, where, b, in_sys);
    if (!strcmp(t, "input_text")) {
        if (dapi_only_keys(ps, part, where, TEXT_KEYS) < 0) return -1;
        json_t *text = json_object_get(part, "text");
        FIELD(param, "%s.text", where);
        if (!json_is_string(text)) return dapi_bad(ps->e, param, "%s must be a string", param);
        if (dapi_put_text(ps, b, text) < 0) return -1;
        json_t *bp = dapi_get(part, "prompt_cache_breakpoint");
        if (bp) {
            json_t *mode = json_object_get(bp, "mode");
            FIELD(param, "%s.prompt_cache_breakpoint", where);
            if (!json_is_object(bp) || json_object_size(bp) != 1 || !json_is_string(mode) ||
                strcmp(json_string_value(mode), "explicit"))
                return dapi_bad(ps->e, param, "%s must be {\"mode\": \"explicit\"}", param);
            if (ps->n_bp < SQUAD_DAPI_MAX_BREAKPOINTS) {
                ps->bp_off[ps->n_bp] = b->n;
                ps->bp_in_sys[ps->n_bp] = in_sys;
                ps->n_bp++;
            }
        }
        return 0;
    }
    if (!strcmp(t, "input_json")) {
        if (dapi_only_keys(ps, part, where, JSON_KEYS) < 0) return -1;
        json_t *data = json_object_get(part, "data");
        FIELD(param, "%s.data", where);
        if (!json_is_object(data) && !json_is_array(data))
            return dapi_bad(ps->e, param, "%s must be an object or an array", param);
        return dapi_put_text(ps, b, data);
    }
    return dapi_bad(ps->e, param,
                    "%s: content parts of type \"%.40s\" are not supported (input_text, input_json, input_image)", param,
                    t);
}

/* One input item (a message): its text joins the system message or the state. */
static int decisions_item(parse_state *ps, json_t *item, size_t i) {
    static const char *const KEYS[] = {"type", "role", "content", NULL};
    char where[64], param[128];
    FIELD(where, "input[%zu]", i);
    if (!json_is_object(item)) return dapi_bad(ps->e, where, "%s must be an object (a message)", where);
    json_t *type = dapi_get(item, "type");
    FIELD(param, "%s.type", where);
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "message")))
        return dapi_bad(ps->e, param, "%s: input items of type %s%.40s%s are not supported (only messages)", param,
                   json_is_string(type) ? "\"" : "", json_is_string(type) ? json_string_value(type) : squad_json_kind(type),
                   json_is_string(type) ? "\"" : "");
    if (dapi_only_keys(ps, item, where, KEYS) < 0) return -1;
    json_t *role = json_object_get(item, "role");
    FIELD(param, "%s.role", where);
    if (!json_is_string(role)) return dapi_bad(ps->e, param, "%s must be \"user\", \"system\" or \"developer\"", param);
    const char *r = json_string_value(role);
    int in_sys = !strcmp(r, "system") || !strcmp(r, "developer");
    if (!in_sys && strcmp(r, "user"))
        return dapi_bad(ps->e, param, "%s: messages with role \"%.40s\" are not supported (user, system, developer)", param,
                   r);
    squad_buf *b = in_sys ? &ps->sys : &ps->state;
    int *have = in_sys ? &ps->have_sys : &ps->have_state;
    if (*have && squad_buf_puts(b, MESSAGE_JOIN) < 0) return dapi_oom(ps->e);
    *have = 1;
    json_t *content = json_object_get(item, "content");
    FIELD(param, "%s.content", where);
    if (json_is_string(content)) return dapi_put_text(ps, b, content);
    if (!json_is_array(content)) return dapi_bad(ps->e, param, "%s must be a string or a list of content parts", param);
    for (size_t j = 0; j < json_array_size(content); j++) {
        char pw[128];
        FIELD(pw, "%s[%zu]", param, j);
        if (j && squad_buf_puts(b, PART_JOIN) < 0) return dapi_oom(ps->e);
        if (decisions_part(ps, json_array_get(content, j), pw, b, in_sys) < 0) return -1;
    }
    return 0;
}

static int decisions_input(parse_state *ps, json_t *input) {
    if (!input) return dapi_bad(ps->e, "input", "input is missing");
    if (json_is_string(input)) {
        ps->have_state = 1;
        return dapi_put_text(ps, &ps->state, input);
    }
    if (!json_is_array(input)) return dapi_bad(ps->e, "input", "input must be a string or a list of messages");
    for (size_t i = 0; i < json_array_size(input); i++)
        if (decisions_item(ps, json_array_get(input, i), i) < 0) return -1;
    return 0;
}

static int decisions_instructions(parse_state *ps, json_t *v, const char *where, squad_buf *out) {
    char param[128];
    FIELD(param, "%s.instructions", where);
    if (!v) return dapi_bad(ps->e, param, "%s is missing", param);
    if (json_is_string(v)) return dapi_put_text(ps, out, v);
    if (!json_is_array(v)) return dapi_bad(ps->e, param, "%s must be a string or a list of input_text parts", param);
    static const char *const KEYS[] = {"type", "text", "prompt_cache_breakpoint", NULL};
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *p = json_array_get(v, i);
        char pw[160], pp[176];
        FIELD(pw, "%s[%zu]", param, i);
        if (!json_is_object(p)) return dapi_bad(ps->e, pw, "%s must be an input_text part", pw);
        json_t *t = json_object_get(p, "type"), *text = json_object_get(p, "text");
        FIELD(pp, "%s.type", pw);
        if (!json_is_string(t) || strcmp(json_string_value(t), "input_text"))
            return dapi_bad(ps->e, pp, "%s must be \"input_text\"", pp);
        if (dapi_only_keys(ps, p, pw, KEYS) < 0) return -1;
        FIELD(pp, "%s.text", pw);
        if (!json_is_string(text)) return dapi_bad(ps->e, pp, "%s must be a string", pp);
        if ((i && squad_buf_puts(out, PART_JOIN) < 0)) return dapi_oom(ps->e);
        if (dapi_put_text(ps, out, text) < 0) return -1;
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
    if (!json_is_object(q)) return dapi_bad(ps->e, where, "%s must be an object", where);
    dq->q = q;
    json_t *type = json_object_get(q, "type");
    FIELD(param, "%s.type", where);
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!strcmp(t, "predicate")) dq->kind = Q_PREDICATE;
    else if (!strcmp(t, "choice")) dq->kind = Q_CHOICE;
    else if (!strcmp(t, "score")) dq->kind = Q_SCORE;
    else return dapi_bad(ps->e, param, "%s must be \"predicate\", \"choice\" or \"score\"", param);
    if (dapi_only_keys(ps, q, where, KEYS[dq->kind]) < 0) return -1;
    json_t *name = dapi_get(q, "name");
    FIELD(param, "%s.name", where);
    if (name && !json_is_string(name)) return dapi_bad(ps->e, param, "%s must be a string", param);
    squad_buf instr = {0};
    int rc = decisions_instructions(ps, json_object_get(q, "instructions"), where, &instr);
    if (rc == 0) rc = dapi_block_start(ps, b, &instr);
    free(instr.s);
    if (rc < 0) return -1;
    const int32_t *letters = ps->ctx->letters;
    if (dq->kind == Q_PREDICATE) {
        dq->n_opts = 2;
        if (dapi_option_line(ps, b, "A", "false", 5, NULL) < 0 || dapi_option_line(ps, b, "B", "true", 4, NULL) < 0) return -1;
    } else {
        int choice = dq->kind == Q_CHOICE;
        const char *field = choice ? "choices" : "levels";
        int max = choice ? SQUAD_DAPI_MAX_CHOICES : SQUAD_DAPI_MAX_LEVELS;
        json_t *opts = json_object_get(q, field);
        FIELD(param, "%s.%s", where, field);
        if (!json_is_array(opts))
            return dapi_bad(ps->e, param, "%s %s", param, opts ? "must be a list" : "is missing");
        size_t n = json_array_size(opts);
        if (n < 2 || n > (size_t)max)
            return dapi_bad(ps->e, param, "%s has %zu entries; between 2 and %d are allowed", param, n, max);
        dq->opts = opts;
        dq->n_opts = (int)n;
        for (size_t j = 0; j < n; j++) {
            static const char *const CHOICE_KEYS[] = {"value", "description", NULL};
            static const char *const LEVEL_KEYS[] = {"label", "description", NULL};
            json_t *o = json_array_get(opts, j);
            char ow[160], op[176];
            FIELD(ow, "%s[%zu]", param, j);
            if (!json_is_object(o)) return dapi_bad(ps->e, ow, "%s must be an object", ow);
            if (dapi_only_keys(ps, o, ow, choice ? CHOICE_KEYS : LEVEL_KEYS) < 0) return -1;
            json_t *desc = dapi_get(o, "description");
            FIELD(op, "%s.description", ow);
            if (desc && !json_is_string(desc)) return dapi_bad(ps->e, op, "%s must be a string", op);
            json_t *v = json_object_get(o, choice ? "value" : "label");
            FIELD(op, "%s.%s", ow, choice ? "value" : "label");
            char label[2] = {(char)('A' + j), 0};
            if (choice) {
                if (!json_is_string(v) && !json_is_boolean(v))
                    return dapi_bad(ps->e, op, "%s must be a string or a boolean", op);
                for (size_t k = 0; k < j; k++)
                    if (json_equal(v, json_object_get(json_array_get(opts, k), "value")))
                        return dapi_bad(ps->e, op, "%s repeats %s[%zu].value; values must be distinct", op, param, k);
                squad_err err = {0};
                size_t tn;
                char *text = squad_json_text(v, &tn, &err);
                if (!text) return dapi_from_err(ps->e, &err);
                rc = dapi_option_line(ps, b, label, text, tn, desc);
                free(text);
                if (rc < 0) return -1;
            } else {
                if (!json_is_string(v)) return dapi_bad(ps->e, op, "%s %s", op, v ? "must be a string" : "is missing");
                if (dapi_option_line(ps, b, label, json_string_value(v), json_string_length(v), desc) < 0) return -1;
            }
        }
    }
    memcpy(dq->labels, letters, (size_t)dq->n_opts * sizeof(int32_t));
    return dapi_block_end(ps, b, CLOSE_LETTER);
}


int dapi_openai_parse(parse_state *ps, json_t *root, int *spec) {
    static const char *const KEYS[] = {"model",           "input",           "questions", "safety_identifier",
                                       "prompt_cache_key", "prompt_cache_options", NULL};
    if (dapi_only_keys(ps, root, "", KEYS) < 0) return -1;
    json_t *model = json_object_get(root, "model");
    if (!json_is_string(model)) return dapi_bad(ps->e, "model", "model %s", model ? "must be a string" : "is missing");
    if (!dapi_find_model(ps->ctx, json_string_value(model), spec)) return dapi_not_found(ps, json_string_value(model));
    json_t *v;
    if ((v = dapi_get(root, "safety_identifier")) && !json_is_string(v))
        return dapi_bad(ps->e, "safety_identifier", "safety_identifier must be a string");
    if ((v = dapi_get(root, "prompt_cache_key")) && !json_is_string(v))
        return dapi_bad(ps->e, "prompt_cache_key", "prompt_cache_key must be a string");
    if ((v = dapi_get(root, "prompt_cache_options")) && !json_is_object(v))
        return dapi_bad(ps->e, "prompt_cache_options", "prompt_cache_options must be an object");
    if (decisions_input(ps, json_object_get(root, "input")) < 0) return -1;
    json_t *qs = json_object_get(root, "questions");
    if (!json_is_array(qs)) return dapi_bad(ps->e, "questions", "questions %s", qs ? "must be a list" : "is missing");
    size_t n = json_array_size(qs);
    if (n < 1 || n > SQUAD_DAPI_MAX_QUESTIONS)
        return dapi_bad(ps->e, "questions", "questions has %zu entries; between 1 and %d are allowed", n,
                   SQUAD_DAPI_MAX_QUESTIONS);
    ps->n_q = (int)n;
    ps->qs = calloc(n, sizeof *ps->qs);
    ps->blocks = calloc(n, sizeof *ps->blocks);
    if (!ps->qs || !ps->blocks) return dapi_oom(ps->e);
    for (size_t i = 0; i < n; i++)
        if (decisions_question(ps, json_array_get(qs, i), (int)i) < 0) return -1;
    return 0;
}



json_t *dapi_openai_answer(const dapi_question *dq, const squad_result *res, int *failed) {
    const float *p = res->probs[0];
    json_t *a = json_object();
    if (!a) {
        *failed = 1;
        return NULL;
    }
    static const char *const TYPES[] = {"predicate", "choice", "score"};
    dapi_put(a, "type", json_string(TYPES[dq->kind]), failed);
    dapi_put(a, "name", dapi_name_of(dq), failed);
    if (dq->kind == Q_PREDICATE) {
        dapi_put(a, "probability", dapi_prob(p[1]), failed);
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
            dapi_put(e, "value", json_incref(json_object_get(o, "value")), failed);
        } else {
            dapi_put(e, "value", json_integer(i), failed);
            dapi_put(e, "label", json_incref(json_object_get(o, "label")), failed);
            expect += i * (double)p[i];
        }
        dapi_put(e, "probability", dapi_prob(p[i]), failed);
        dapi_push(probs, e, failed);
    }
    if (dq->kind == Q_CHOICE) dapi_put(a, "choice", json_incref(json_object_get(json_array_get(dq->opts, (size_t)top), "value")), failed);
    else dapi_put(a, "score", json_real(expect), failed);
    dapi_put(a, "probabilities", probs, failed);
    dapi_put(a, "confidence", dapi_prob(p[top] * dapi_label_mass(res)), failed);
    return a;
}


json_t *dapi_openai_body(const squad_dapi_req *r, const squad_result *results, const squad_dapi_fields *f,
                         const dapi_totals *t, int *failed) {
    const struct squad_dapi_store *s = r->store;
    json_t *body = json_object();
    if (!body) {
        *failed = 1;
        return NULL;
    }
    json_t *answers = json_array(), *usage = json_object(), *details = json_object();
    dapi_put(body, "model", json_string(r->model), failed);
    dapi_put(body, "answers", answers, failed);
    for (int i = 0; i < r->n_rows && answers; i++) dapi_push(answers, dapi_openai_answer(&s->qs[i], &results[i], failed), failed);
    dapi_put(body, "usage", usage, failed);
    if (usage) {
        dapi_put(usage, "input_tokens", json_integer(t->input), failed);
        if (details) {
            dapi_put(details, "cached_tokens", dapi_field(f->cached_tokens, t->cached), failed);
            dapi_put(details, "cache_write_tokens", dapi_field(f->cache_write_tokens, t->written), failed);
        }
        dapi_put(usage, "input_tokens_details", details, failed);
        dapi_put(usage, "output_tokens", json_integer(r->n_rows), failed);
        dapi_put(usage, "output_tokens_details", json_pack("{s:i}", "reasoning_tokens", 0), failed);
        dapi_put(usage, "total_tokens", json_integer(t->input + r->n_rows), failed);
    } else {
        json_decref(details);
    }
    return body;
}
