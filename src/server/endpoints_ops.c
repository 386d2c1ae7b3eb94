/*
 * endpoints_ops.c — the operational endpoints (endpoints.h): GET /health, /ready, /metrics (Prometheus
 * text), /v1/models (OpenAI's list and TypeSafe's), /v1/stats (JSON) and POST /v1/cache/clear (drops
 * the request memo and the token cache here, the engine's state cache and memo through a job).
 * None of them needs the engine ready, and none goes through the request memo.
 */
#include "server/endpoints.h"

#include <string.h>

#include "answer_json.h"

static void view_of(squad_server *srv, srv_metrics_view *v) {
    memset(v, 0, sizeof *v);
    v->m = &srv->metrics;
    v->sp = srv->sp;
    if (srv->jobs) srv_jobs_get_stats(srv->jobs, &v->jobs);
    if (srv->memo) squad_lru_map_get_stats(srv->memo, &v->memo);
    if (srv->tokens) squad_lru_map_get_stats(srv->tokens, &v->tokens);
    v->uptime_s = squad_now_seconds() - srv->t_start;
}

/* /v1/models: the served name (with specialists: the router decides), then each route's label
 * (naming one forces it), in OpenAI's list and TypeSafe's. */
static void answer_models(srv_req *r) {
    squad_server *srv = r->srv;
    const int n = srv->sp ? squad_specialists_count(srv->sp) : 0;
    squad_buf b = {0};
    squad_buf_puts(&b, "{\"object\": \"list\", \"data\": [");
    for (int i = -1; i < n; i++) {
        squad_buf_puts(&b, i < 0 ? "{\"id\": " : ", {\"id\": ");
        squad_buf_json_string(&b, i < 0 ? srv->served_name : squad_specialists_label(srv->sp, i));
        squad_buf_printf(&b, ", \"object\": \"model\", \"created\": %ld, \"owned_by\": \"squad\"}", srv->created_unix);
    }
    squad_buf_puts(&b, "], \"models\": [");
    for (int i = -1; i < n; i++) {
        squad_buf_puts(&b, i < 0 ? "{\"name\": " : ", {\"name\": ");
        squad_buf_json_string(&b, i < 0 ? srv->served_name : squad_specialists_label(srv->sp, i));
        if (i < 0)
            squad_buf_puts(&b, n ? ", \"description\": \"a squad of Qwen3.5-architecture specialists served by squad: a "
                                   "router picks each question's specialist; multiple-choice answers read from "
                                   "next-token scores\""
                                 : ", \"description\": \"a Qwen3.5-architecture model served by squad: multiple-choice "
                                   "answers read from next-token scores\"");
        else if (i == 0)
            squad_buf_puts(&b, ", \"description\": \"the trunk alone (no specialist's adapter)\"");
        else
            squad_buf_puts(&b, ", \"description\": \"this specialist's adapter, forced (the router is not asked)\"");
        squad_buf_puts(&b, ", \"release_date\": ");
        squad_buf_json_string(&b, srv->release_date);
        squad_buf_puts(&b, "}");
    }
    squad_buf_puts(&b, "]}");
    srv_answer_buf(r, 200, &b, SRV_CT_JSON);
}

int srv_ops_endpoint(srv_endpoint ep) {
    return ep == SRV_EP_HEALTH || ep == SRV_EP_READY || ep == SRV_EP_MODELS || ep == SRV_EP_METRICS ||
           ep == SRV_EP_STATS || ep == SRV_EP_CACHE_CLEAR;
}

int srv_ops_prepare(srv_req *r) {
    squad_server *srv = r->srv;
    switch (r->ep) {
    case SRV_EP_HEALTH: srv_answer_status(r, 200, "ok"); return 1;
    case SRV_EP_READY: {
        int ready = srv->jobs ? srv_jobs_ready(srv->jobs, NULL) : 0;
        srv_answer_status(r, ready == 1 ? 200 : 503, ready == 1 ? "ready" : ready < 0 ? "failed" : "loading");
        return 1;
    }
    case SRV_EP_MODELS: answer_models(r); return 1;
    case SRV_EP_METRICS:
    case SRV_EP_STATS: {
        srv_metrics_view v;
        view_of(srv, &v);
        squad_buf b = {0};
        if (r->ep == SRV_EP_METRICS) srv_metrics_prometheus(&b, &v);
        else srv_metrics_json(&b, &v);
        srv_answer_buf(r, 200, &b, r->ep == SRV_EP_METRICS ? SRV_CT_PROM : SRV_CT_JSON);
        return 1;
    }
    case SRV_EP_CACHE_CLEAR:
        if (srv->memo) squad_lru_map_clear(srv->memo);
        if (srv->tokens) squad_lru_map_clear(srv->tokens);
        if (srv_req_alloc_work(r, 1) < 0) return 1;
        r->job.kind = SRV_JOB_CLEAR;
        return 0;
    default: srv_fail(r, 404, NULL, "not an operational endpoint"); return 1;
    }
}
