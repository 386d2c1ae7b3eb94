/*
 * endpoints_decisions.c — the decision APIs (endpoints.h): POST /v1/decisions (OpenAI's) and POST
 * /v1/systemone (System One's), as docs/decisions-api.md says. decisions.h parses a body into rows
 * and renders the rows' results; this file checks the server's limits, forces the route a model
 * name names, and hands the rendered text to the request and the request memo.
 */
#include "server/endpoints.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_text.h"
#include "server/request_memo.h"

int srv_decision_prepare(srv_req *r) {
    squad_server *srv = r->srv;
    squad_dapi api = r->ep == SRV_EP_DECISIONS ? SQUAD_DAPI_DECISIONS : SQUAD_DAPI_SYSTEMONE;
    squad_dapi_error de;
    memset(&de, 0, sizeof de);
    const char *why = squad_dapi_disabled(srv->dapi, api);
    if (why) {
        srv_fail(r, 501, NULL, "%s", why);
        return 1;
    }
    const squad_image_loader images = srv_images_loader(&r->images, srv->model, srv->served_name, srv->opts.max_image_pixels); /* input_image parts */
    if (squad_dapi_parse_images(srv->dapi, api, srv_req_body_text(r), r->body.n, &images, &r->dreq, &de) < 0) {
        if (strstr(de.message, SQUAD_ROW_TOO_LONG)) { /* which limit it was */
            const size_t n = strlen(de.message);
            snprintf(de.message + n, sizeof de.message - n, " (%s)", srv->max_tokens_limit);
        }
        srv_fail_dapi(r, &de);
        return 1;
    }
    if (r->dreq->n_rows > srv->opts.max_questions) {
        srv_fail(r, 400, "questions", "the request has %d questions; --max-questions is %d", r->dreq->n_rows,
                 srv->opts.max_questions);
        return 1;
    }
    if (srv_req_alloc_work(r, r->dreq->n_rows) < 0) return 1;
    /* a model naming a route forces it (the names are the routes' labels in route order) */
    for (int i = 0; i < r->dreq->n_rows; i++) r->dreq->rows[i].specialist = r->dreq->specialist + 1;
    for (int i = 0; i < r->dreq->n_rows; i++) r->row_ptrs[i] = &r->dreq->rows[i];
    r->job.n_rows = r->dreq->n_rows;
    r->job.want_vocab = 1;
    r->job.checkpoints = r->dreq->breakpoints; /* prompt_cache_breakpoint: checkpoints there too */
    r->job.n_checkpoints = r->dreq->n_breakpoints;
    return 0;
}

/* The response once, its per-call fields and cache figures placeholders that srv_memo_answer fills
 * for the client and for the memo. */
void srv_decision_render(srv_req *r) {
    const squad_server *srv = r->srv;
    squad_dapi_fields f = {srv_memo_hole_json(srv, SRV_HOLE_ID, -1), srv_memo_hole_json(srv, SRV_HOLE_CREATED, -1),
                           srv_memo_hole_json(srv, SRV_HOLE_REUSED, -1), srv_memo_hole_json(srv, SRV_HOLE_WRITTEN, -1)};
    squad_err err = {0};
    json_t *resp = f.id && f.created && f.cached_tokens && f.cache_write_tokens
                       ? squad_dapi_respond(r->dreq, r->results, &f, &err)
                       : NULL;
    json_decref(f.id);
    json_decref(f.created);
    json_decref(f.cached_tokens);
    json_decref(f.cache_write_tokens);
    size_t len = 0;
    char *text = resp ? squad_json_text(resp, &len, &err) : NULL; /* reals in their shortest form */
    json_decref(resp);
    if (!text) {
        srv_fail(r, 500, NULL, "could not render the response");
        return;
    }
    squad_buf b = {.s = text, .n = len, .cap = len + 1}; /* squad_json_text allocated len + 1 */
    srv_memo_answer(r, &b);
}
