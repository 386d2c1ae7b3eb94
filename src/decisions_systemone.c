/*
 * decisions_systemone.c — System One's decision API, POST /v1/systemone (docs/decisions-api.md
 * section B): a request body into the parse state (the state; each question's block: noul, choice
 * with criteria, score with levels), and the rows' results into the response (the answers keyed by
 * question id, the diagnostics, the usage, a new id and the time). decisions.c turns the parse
 * state into rows and frames the response.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decisions_internal.h"

/* The model field: absent, the served name, jev-latest, jev-* (the router decides), a specialist. */
static int systemone_model(parse_state *ps, json_t *model, int *spec) {
    *spec = -1;
    if (!model) return 0;
    if (!json_is_string(model)) return dapi_bad(ps->e, "model", "model must be a string");
    const char *m = json_string_value(model);
    if (dapi_find_model(ps->ctx, m, spec) || !strncmp(m, "jev-", 4)) return 0; /* a specialist's name first */
    return dapi_not_found(ps, m);
}

static int systemone_question(parse_state *ps, const char *id, json_t *q, int qi) {
    static const char *const KEYS[] = {"type", "instructions", "criteria", NULL};
    dapi_question *dq = &ps->qs[qi];
    squad_buf *b = &ps->blocks[qi];
    char where[160], param[192];
    FIELD(where, "questions.%.120s", id);
    if (!json_is_object(q)) return dapi_bad(ps->e, where, "%s must be an object", where);
    dq->q = q;
    dq->id = id;
    json_t *type = json_object_get(q, "type");
    FIELD(param, "%s.type", where);
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!strcmp(t, "noul")) dq->kind = Q_NOUL;
    else if (!strcmp(t, "choice")) dq->kind = Q_SO_CHOICE;
    else if (!strcmp(t, "score")) dq->kind = Q_SO_SCORE;
    else return dapi_bad(ps->e, param, "%s must be \"noul\", \"choice\" or \"score\"", param);
    if (dapi_only_keys(ps, q, where, KEYS) < 0) return -1;
    squad_buf instr = {0};
    json_t *iv = dapi_get(q, "instructions");
    int rc = iv ? dapi_put_text(ps, &instr, iv) : 0;
    if (rc == 0) rc = dapi_block_start(ps, b, &instr);
    free(instr.s);
    if (rc < 0) return -1;
    json_t *crit = dapi_get(q, "criteria");
    FIELD(param, "%s.criteria", where);
    dq->opts = crit;
    if (dq->kind == Q_NOUL) {
        static const char *const NOUL_KEYS[] = {"true", "false", NULL};
        if (crit && !json_is_object(crit)) return dapi_bad(ps->e, param, "%s must be an object", param);
        if (crit && dapi_only_keys(ps, crit, param, NOUL_KEYS) < 0) return -1;
        for (int side = 0; side < 2; side++) {
            const char *key = side ? "false" : "true";
            json_t *d = crit ? dapi_get(crit, key) : NULL;
            char dp[208];
            FIELD(dp, "%s.%s", param, key);
            if (d && !json_is_string(d)) return dapi_bad(ps->e, dp, "%s must be a string", dp);
            if (d && json_string_length(d) &&
                dapi_option_line(ps, b, side ? "no" : "yes", json_string_value(d), json_string_length(d), NULL) < 0)
                return -1;
        }
        dq->n_opts = N_NOUL;
        memcpy(dq->labels, ps->ctx->noul, sizeof ps->ctx->noul);
        return dapi_block_end(ps, b, CLOSE_NOUL);
    }
    if (dq->kind == Q_SO_CHOICE) {
        if (!json_is_object(crit))
            return dapi_bad(ps->e, param, "%s %s", param, crit ? "must be an object (name -> description)" : "is missing");
        size_t n = json_object_size(crit);
        if (n < 1 || n > SQUAD_DAPI_MAX_CHOICES)
            return dapi_bad(ps->e, param, "%s has %zu entries; between 1 and %d are allowed", param, n,
                       SQUAD_DAPI_MAX_CHOICES);
        const char *name;
        json_t *d;
        int j = 0;
        json_object_foreach(crit, name, d) {
            char dp[208], label[2] = {(char)('A' + j), 0};
            FIELD(dp, "%s.%.60s", param, name);
            if (!json_is_null(d) && !json_is_string(d)) return dapi_bad(ps->e, dp, "%s must be a string or null", dp);
            if (dapi_option_line(ps, b, label, name, strlen(name), d) < 0) return -1;
            j++;
        }
        dq->n_opts = (int)n;
        memcpy(dq->labels, ps->ctx->letters, n * sizeof(int32_t));
        return dapi_block_end(ps, b, CLOSE_LETTER);
    }
    if (!json_is_array(crit))
        return dapi_bad(ps->e, param, "%s %s", param, crit ? "must be a list of level texts" : "is missing");
    size_t n = json_array_size(crit);
    if (n < 2 || n > SQUAD_DAPI_MAX_LEVELS)
        return dapi_bad(ps->e, param, "%s has %zu entries; between 2 and %d are allowed", param, n, SQUAD_DAPI_MAX_LEVELS);
    for (size_t j = 0; j < n; j++) {
        json_t *d = json_array_get(crit, j);
        char dp[208], label[2] = {(char)('0' + j), 0};
        FIELD(dp, "%s[%zu]", param, j);
        if (!json_is_null(d) && !json_is_string(d)) return dapi_bad(ps->e, dp, "%s must be a string or null", dp);
        const char *text = json_is_string(d) ? json_string_value(d) : "";
        size_t tn = json_is_string(d) ? json_string_length(d) : 0;
        if (dapi_option_line(ps, b, label, text, tn, NULL) < 0) return -1;
    }
    dq->n_opts = (int)n;
    memcpy(dq->labels, ps->ctx->digits, n * sizeof(int32_t));
    return dapi_block_end(ps, b, CLOSE_NUMBER);
}

int dapi_systemone_parse(parse_state *ps, json_t *root, int *spec) {
    static const char *const KEYS[] = {"state", "model", "instructions", "questions", NULL};
    if (dapi_only_keys(ps, root, "", KEYS) < 0) return -1;
    if (systemone_model(ps, dapi_get(root, "model"), spec) < 0) return -1;
    json_t *instr = dapi_get(root, "instructions");
    if (instr && !json_is_string(instr) && !json_is_object(instr) && !json_is_array(instr))
        return dapi_bad(ps->e, "instructions", "instructions must be a string, an object, an array or null");
    if (instr && dapi_put_text(ps, &ps->sys, instr) < 0) return -1;
    json_t *qs = json_object_get(root, "questions");
    if (!json_is_object(qs))
        return dapi_bad(ps->e, "questions", "questions %s", qs ? "must be an object (id -> question)" : "is missing");
    size_t n = json_object_size(qs);
    if (n < 1 || n > SQUAD_DAPI_MAX_QUESTIONS)
        return dapi_bad(ps->e, "questions", "questions has %zu entries; between 1 and %d are allowed", n,
                   SQUAD_DAPI_MAX_QUESTIONS);
    ps->n_q = (int)n;
    ps->qs = calloc(n, sizeof *ps->qs);
    ps->blocks = calloc(n, sizeof *ps->blocks);
    if (!ps->qs || !ps->blocks) return dapi_oom(ps->e);
    const char *id;
    json_t *q;
    int i = 0;
    json_object_foreach(qs, id, q) {
        if (systemone_question(ps, id, q, i) < 0) return -1;
        i++;
    }
    /* The state may be any JSON value but null (section B): absent and null are a 400. */
    json_t *state = dapi_get(root, "state");
    if (!state) return dapi_bad(ps->e, "state", "state is missing (a string, object, array, number or boolean)");
    return dapi_put_text(ps, &ps->state, state);
}


json_t *dapi_systemone_answer(const dapi_question *dq, const squad_result *res, int *failed) {
    const float *p = res->probs[0];
    json_t *a = json_object(), *probs = json_object();
    if (!a || !probs) {
        json_decref(a);
        json_decref(probs);
        *failed = 1;
        return NULL;
    }
    double mass = dapi_label_mass(res);
    if (dq->kind == Q_NOUL) {
        double yes = (double)p[0] + p[2], no = (double)p[1] + p[3];
        dapi_put(a, "type", json_string("noul"), failed);
        dapi_put(a, "noul", dapi_prob(yes), failed);
        dapi_put(probs, "yes", dapi_prob(yes), failed);
        dapi_put(probs, "no", dapi_prob(no), failed);
        dapi_put(a, "probabilities", probs, failed);
        dapi_put(a, "confidence", dapi_prob((yes >= no ? yes : no) * mass), failed);
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
            dapi_put(probs, name, dapi_prob(p[i]), failed);
            i++;
        }
        dapi_put(a, "type", json_string("choice"), failed);
        dapi_put(a, "choice", json_string(top_name), failed);
    } else {
        json_t *legend = json_object();
        if (!legend) *failed = 1;
        double expect = 0;
        for (int i = 0; i < dq->n_opts && legend; i++) {
            char key[4];
            FIELD(key, "%d", i);
            json_t *d = json_array_get(dq->opts, (size_t)i);
            dapi_put(legend, key, json_is_string(d) ? json_incref(d) : json_string(""), failed);
            dapi_put(probs, key, dapi_prob(p[i]), failed);
            expect += i * (double)p[i];
        }
        dapi_put(a, "type", json_string("score"), failed);
        dapi_put(a, "score", json_real(expect), failed);
        dapi_put(a, "legend", legend, failed);
    }
    dapi_put(a, "probabilities", probs, failed);
    dapi_put(a, "confidence", dapi_prob(p[top] * mass), failed);
    return a;
}


json_t *dapi_systemone_body(const squad_dapi_req *r, const squad_result *results, const squad_dapi_fields *f,
                            const dapi_totals *t, int *failed) {
    const struct squad_dapi_store *s = r->store;
    json_t *body = json_object();
    if (!body) {
        *failed = 1;
        return NULL;
    }
    json_t *id = f->id ? json_incref(f->id) : NULL;
    if (!id) {
        char text[64];
        squad_dapi_new_id(text, sizeof text);
        id = json_string(text);
    }
    json_t *answers = json_object(), *diag = json_object();
    dapi_put(body, "id", id, failed);
    dapi_put(body, "object", json_string("structured_decision"), failed);
    dapi_put(body, "created", dapi_field(f->created, (json_int_t)time(NULL)), failed);
    dapi_put(body, "model", json_string(r->model), failed);
    dapi_put(body, "answers", answers, failed);
    for (int i = 0; i < r->n_rows && answers && diag; i++) {
        dapi_put(answers, s->qs[i].id, dapi_systemone_answer(&s->qs[i], &results[i], failed), failed);
        dapi_put(diag, s->qs[i].id,
                 json_pack("{s:o, s:b}", "label_mass", dapi_prob(dapi_label_mass(&results[i])), "argmax_is_label",
                           dapi_argmax_is_label(&r->rows[i], &results[i])),
                 failed);
    }
    dapi_put(body, "usage", json_pack("{s:I, s:i}", "input_tokens", (json_int_t)t->input, "output_tokens", r->n_rows),
             failed);
    dapi_put(body, "diagnostics", diag, failed);
    return body;
}
