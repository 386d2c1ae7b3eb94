/*
 * endpoints.h — the endpoints, one file per API family: what each makes of a request (prepare: parse,
 * validate, tokenise into r->job's rows, or answer at once) and of its finished job (render: the
 * answer's text, once; the request memo's copy is derived from it).
 *
 *   endpoints_squad.c      squad's own POST /v1/ask and /v1/score
 *   endpoints_decisions.c  the decision APIs, POST /v1/decisions and /v1/systemone (decisions.h)
 *   endpoints_ops.c        the operational GET /health, /ready, /metrics, /v1/models, /v1/stats and
 *                          POST /v1/cache/clear
 *
 * A prepare returns 1 when it answered (r->status set), 0 when r->job is ready for the engine. A
 * render runs after the job ended well (router.c answers the job's failures) and answers.
 */
#ifndef SQUAD_SERVER_ENDPOINTS_H
#define SQUAD_SERVER_ENDPOINTS_H

#include "server/request.h"

int srv_ask_prepare(srv_req *r);
void srv_ask_render(srv_req *r);
int srv_score_prepare(srv_req *r);
void srv_score_render(srv_req *r);

int srv_decision_prepare(srv_req *r);
void srv_decision_render(srv_req *r);

/* 1 when ep is one of endpoints_ops.c's. */
int srv_ops_endpoint(srv_endpoint ep);
int srv_ops_prepare(srv_req *r);

#endif /* SQUAD_SERVER_ENDPOINTS_H */
