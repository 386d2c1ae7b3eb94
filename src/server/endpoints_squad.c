/*
 * endpoints_squad.c — squad's own API (endpoints.h, docs/server.md): POST /v1/ask (a request through
 * the prompt template, answered as `squad ask` answers) and POST /v1/score (token rows as `squad
 * score` reads them, each row's answer or error as `squad score` writes it). Bodies are parsed
 * strictly (duplicate keys refused, unknown fields named). Both take a "session" or "user" string
 * naming the agent's session (docs/scale.md): for the balancer and the log, never for the answer.
 */
#include "server/endpoints.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "answer_json.h"
#include "json_text.h"
#include "server/request_memo.h"

/* Reads the body with squad's one JSON reader (json_text.h: the same policy on every endpoint and
 * the command line): NULL after answering 400. */
static json_t *parse_strict(srv_req *r) {
    squad_err err = {0};
    json_t *root = squad_json_read_object(srv_req_body_text(r), r->body.n, "the body", &err);
    if (!root) srv_fail(r, err.code == SQUAD_E_NOMEM ? 500 : 400, NULL, "%s", err.msg);
    return root;
}

/* 1 when the body's session fields ("session", "user": docs/scale.md) are absent or strings; else
 * answers 422 (ask) or 400 (score) naming the field and returns 0. */
static int session_fields_ok(srv_req *r, json_t *root, int status) {
    static const char *const fields[] = {"session", "user"};
    for (size_t i = 0; json_is_object(root) && i < sizeof fields / sizeof fields[0]; i++) {
        json_t *v = json_object_get(root, fields[i]);
        if (v && !json_is_string(v)) {
            srv_fail(r, status, fields[i], "\"%s\" must be a string (it names the session)", fields[i]);
            return 0;
        }
    }
    return 1;
}

/* The first field an ask request must not have (its path in where), or NULL. The template reads
 * only the fields it knows; the server refuses the rest (section F: 422), so a misspelt field is
 * not silently ignored. */
static const char *ask_unknown_field(json_t *root, char *where, size_t cap) {
    if (!json_is_object(root)) return NULL; /* the template says what is wrong */
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "state") && strcmp(k, "questions") && strcmp(k, "system") && strcmp(k, "specialist") &&
            strcmp(k, "session") && strcmp(k, "user") && strcmp(k, "images")) {
            snprintf(where, cap, "%.60s", k);
            return where;
        }
    }
    json_t *qs = json_object_get(root, "questions");
    for (size_t i = 0; json_is_array(qs) && i < json_array_size(qs); i++) {
        json_t *q = json_array_get(qs, i);
        if (!json_is_object(q)) continue;
        json_object_foreach(q, k, v) {
            if (strcmp(k, "text") && strcmp(k, "options")) {
                snprintf(where, cap, "questions[%zu].%.40s", i, k);
                return where;
            }
        }
    }
    return NULL;
}

/* A "specialist" label as squad_row.specialist: 0 for "auto" (the router decides), the route + 1
 * for a label; -1 with *err (the messages of squad score) for an unknown label, or any label when
 * the server has no specialists. */
static int forced_specialist(const squad_server *srv, const char *label, squad_err *err) {
    if (!strcmp(label, "auto")) return 0;
    int route = srv->sp ? squad_specialists_find(srv->sp, label) : -1;
    if (route >= 0) return route + 1;
    if (srv->sp) squad_fail(err, SQUAD_E_INVALID, "unknown specialist '%.100s'", label);
    else squad_fail(err, SQUAD_E_INVALID, "\"specialist\" '%.100s' needs a server started with --specialists", label);
    return -1;
}

int srv_ask_prepare(srv_req *r) {
    squad_server *srv = r->srv;
    json_t *root = parse_strict(r);
    if (!root) return 1;
    json_t *qs = json_is_object(root) ? json_object_get(root, "questions") : NULL;
    size_t nq = json_is_array(qs) ? json_array_size(qs) : 0;
    char where[96];
    const char *unknown = ask_unknown_field(root, where, sizeof where);
    json_t *spv = json_is_object(root) ? json_object_get(root, "specialist") : NULL;
    int forced = 0;
    squad_err serr = {0};
    if (spv && !json_is_string(spv)) forced = -2;
    else if (spv) forced = forced_specialist(srv, json_string_value(spv), &serr);
    const int session_ok = unknown || session_fields_ok(r, root, 422);
    json_decref(root);
    if (!session_ok) return 1;
    if (!unknown && forced < 0) {
        if (forced == -2) srv_fail(r, 422, "specialist", "\"specialist\" must be a label or \"auto\"");
        else srv_fail(r, 422, "specialist", "%s", serr.msg);
        return 1;
    }
    if (unknown) {
        srv_fail(r, 422, where, "unknown field %s (a request has \"state\", \"questions\", \"system\", "
                 "\"images\", \"specialist\", \"session\" and \"user\"; a question \"text\" and \"options\")", where);
        return 1;
    }
    if (nq > (size_t)srv->opts.max_questions) {
        srv_fail(r, 422, "questions", "\"questions\" has %zu entries; --max-questions is %d", nq, srv->opts.max_questions);
        return 1;
    }
    squad_err err = {0};
    const squad_image_loader images = srv_images_loader(&r->images, srv->model, srv->served_name, srv->opts.max_image_pixels);
    int rc = squad_template_build_images(srv->tpl, srv->tok, srv_req_body_text(r), r->body.n, srv->max_tokens, &images,
                                         &r->ask, &err);
    if (rc < 0) {
        squad_row_limit_name(&err, srv->max_tokens_limit);
        if (r->images.failed) /* an image squad cannot use: 400, as on every API (docs/server.md) */
            srv_fail(r, r->images.out_of_memory ? 500 : 400, "images", "%s", err.msg);
        else if (rc == SQUAD_E_INVALID) srv_fail(r, 422, NULL, "%s", err.msg);
        else srv_fail(r, 500, NULL, "%s", err.msg);
        return 1;
    }
    for (int i = 0; i < r->ask.n_rows; i++) r->ask.rows[i].specialist = forced;
    for (int i = 0; i < r->ask.n_rows; i++)
        if (squad_row_check(srv->model, &r->ask.rows[i], &err) < 0) {
            srv_fail(r, 422, NULL, "%s", err.msg);
            return 1;
        }
    if (srv_req_alloc_work(r, r->ask.n_rows) < 0) return 1;
    for (int i = 0; i < r->ask.n_rows; i++) r->row_ptrs[i] = &r->ask.rows[i];
    r->job.n_rows = r->ask.n_rows;
    return 0;
}

int srv_score_prepare(srv_req *r) {
    squad_server *srv = r->srv;
    json_t *root = parse_strict(r);
    if (!root) return 1;
    json_t *rows = json_object_get(root, "rows");
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "rows") && strcmp(key, "session") && strcmp(key, "user")) {
            srv_fail(r, 400, NULL, "unknown field %.60s (the body is {\"rows\": [row, ...]}, with an optional "
                     "\"session\" or \"user\" string)", key);
            json_decref(root);
            return 1;
        }
    }
    if (!session_fields_ok(r, root, 400)) {
        json_decref(root);
        return 1;
    }
    if (!json_is_array(rows)) {
        srv_fail(r, 400, "rows", "the body must be {\"rows\": [row, ...]}");
        json_decref(root);
        return 1;
    }
    size_t n = json_array_size(rows);
    if (n > SQUAD_SERVE_MAX_SCORE_ROWS) {
        json_decref(root);
        srv_fail(r, 400, "rows", "\"rows\" has %zu rows; at most %d a request", n, SQUAD_SERVE_MAX_SCORE_ROWS);
        return 1;
    }
    r->n_score = (int)n;
    r->score_rows = calloc(n ? n : 1, sizeof *r->score_rows);
    r->score_errs = calloc(n ? n : 1, sizeof *r->score_errs);
    if (!r->score_rows || !r->score_errs || srv_req_alloc_work(r, (int)n) < 0) {
        json_decref(root);
        if (r->state != SRV_REQ_ANSWERED) srv_fail(r, 500, NULL, "out of memory");
        return 1;
    }
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        squad_err *e = &r->score_errs[i];
        if (squad_row_parse_value(&r->score_rows[i], json_array_get(rows, i), NULL, 0, e) < 0) continue;
        if (r->score_rows[i].specialist) { /* a label to its route, as squad score does */
            const int forced = forced_specialist(srv, r->score_rows[i].specialist, e);
            if (forced < 0) continue;
            r->score_rows[i].row.specialist = forced;
        }
        if (r->score_rows[i].row.n_ids > srv->max_tokens) { /* the tighter limit, named */
            squad_fail(e, SQUAD_E_INVALID, "row has %d tokens" SQUAD_ROW_TOO_LONG "%d tokens (%s)",
                       r->score_rows[i].row.n_ids, srv->max_tokens, srv->max_tokens_limit);
            continue;
        }
        if (squad_row_check(srv->model, &r->score_rows[i].row, e) < 0) continue;
        r->row_ptrs[k++] = &r->score_rows[i].row;
    }
    json_decref(root);
    r->job.n_rows = k;
    return 0;
}

/* The answer as `squad ask` writes it, then the server's fields; the figures and the ms are
 * placeholders that srv_memo_answer fills for the client and for the memo. */
void srv_ask_render(srv_req *r) {
    const squad_server *srv = r->srv;
    char computed[SRV_HOLE_TEXT], reused[SRV_HOLE_TEXT];
    srv_memo_placeholder(computed, sizeof computed, srv, SRV_HOLE_COMPUTED, -1);
    srv_memo_placeholder(reused, sizeof reused, srv, SRV_HOLE_REUSED, -1);
    squad_buf b = {0};
    squad_ask_json_head_text(&b, &r->ask, r->results, srv->sp, computed, reused);
    squad_buf_puts(&b, ", \"ms\": ");
    srv_memo_hole(&b, srv, SRV_HOLE_MS, -1);
    squad_buf_puts(&b, ", \"memo\": ");
    srv_memo_hole(&b, srv, SRV_HOLE_MEMO, -1);
    squad_buf_printf(&b, ", \"cache\": {\"reused\": %s, \"computed\": %s, \"written\": ", reused, computed);
    srv_memo_hole(&b, srv, SRV_HOLE_WRITTEN, -1);
    squad_buf_puts(&b, "}}");
    srv_memo_answer(r, &b);
}

/* Each row's answer or error as `squad score` writes it; a row's figures are placeholders. */
void srv_score_render(srv_req *r) {
    const squad_server *srv = r->srv;
    squad_buf b = {0};
    squad_buf_puts(&b, "{\"results\": [");
    int k = 0;
    for (int i = 0; i < r->n_score; i++) {
        if (i) squad_buf_puts(&b, ", ");
        if (r->score_errs[i].code) {
            squad_score_error_json(&b, r->score_errs[i].msg);
            continue;
        }
        int j = k++;
        if (r->errs[j].code) {
            squad_score_error_json(&b, r->errs[j].msg);
            continue;
        }
        char reused[SRV_HOLE_TEXT], computed[SRV_HOLE_TEXT];
        srv_memo_placeholder(reused, sizeof reused, srv, SRV_HOLE_REUSED, j);
        srv_memo_placeholder(computed, sizeof computed, srv, SRV_HOLE_COMPUTED, j);
        squad_score_result_json_text(&b, r->row_ptrs[j], &r->results[j], srv->sp, reused, computed);
    }
    squad_buf_puts(&b, "], \"memo\": ");
    srv_memo_hole(&b, srv, SRV_HOLE_MEMO, -1);
    squad_buf_puts(&b, "}");
    srv_memo_answer(r, &b);
}
