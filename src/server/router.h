/*
 * router.h — a request's life, as a transport (http.c, inproc.c) drives it: the routing table and
 * the keys, then the endpoint's work, then the engine's job, then the answer.
 *
 * A request goes through: srv_req_route (method, path, key, declared length: may answer at once),
 * srv_req_body (request.h: the body, bounded by --max-body), srv_req_prepare (memo, parse,
 * validate, tokenise: answers, or readies a job), srv_req_submit (hands the job to the request
 * queue, jobs.h; a full queue answers 503), then, once the transport's wake has marked the job done,
 * srv_req_finish (renders the answer, once), and at last srv_req_end (request.h). Every step
 * returns to the transport, which sends r->resp: nothing here calls a transport, except through the
 * wake the transport itself put in the request.
 */
#ifndef SQUAD_SERVER_ROUTER_H
#define SQUAD_SERVER_ROUTER_H

#include "server/request.h"

/* 1 when the request is answered already (r->status etc. set), 0 to go on. content_length < 0: not
 * given. */
int srv_req_route(srv_req *r, const char *method, const char *path, const char *authorization,
                  long long content_length);
/* 1 answered; 0 a job is ready to submit. */
int srv_req_prepare(srv_req *r);
/* 0 submitted (wake will be called); 1 answered at once (queue full, stopping). */
int srv_req_submit(srv_req *r);
/* Renders the answer of a finished job. */
void srv_req_finish(srv_req *r);

#endif /* SQUAD_SERVER_ROUTER_H */
