/*
 * router.c — a request's life (router.h): the routing table and the API keys, the dispatch to each
 * endpoint's prepare and render (endpoints.h), the request memo's lookup, the job's submission to
 * the request queue (jobs.h) and the job's end.
 *
 * Connection threads do everything here except scoring: a request that needs the engine becomes a
 * job for the scheduler thread, and its answer is rendered once the job is done, again on the
 * transport's thread (the transport calls srv_req_finish when its wake has marked the job done).
 */
#include "server/router.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "server/endpoints.h"
#include "server/request_memo.h"

typedef struct route {
    const char *path;
    srv_endpoint ep;
    int post; /* 1: POST, 0: GET */
    int open; /* needs no key */
} route;

static const route ROUTES[] = {
    {"/v1/ask", SRV_EP_ASK, 1, 0},          {"/v1/score", SRV_EP_SCORE, 1, 0},
    {"/v1/decisions", SRV_EP_DECISIONS, 1, 0}, {"/v1/systemone", SRV_EP_SYSTEMONE, 1, 0},
    {"/v1/models", SRV_EP_MODELS, 0, 1},    {"/health", SRV_EP_HEALTH, 0, 1},
    {"/ready", SRV_EP_READY, 0, 1},         {"/metrics", SRV_EP_METRICS, 0, 1},
    {"/v1/stats", SRV_EP_STATS, 0, 0},      {"/v1/cache/clear", SRV_EP_CACHE_CLEAR, 1, 0},
};

/* 1 when the Authorization header carries one of the keys (compared without early exit). */
static int key_ok(const squad_server *srv, const char *auth) {
    if (srv->opts.n_api_keys == 0) return 1;
    if (!auth || strncasecmp(auth, "Bearer ", 7)) return 0;
    const char *k = auth + 7;
    while (*k == ' ') k++;
    size_t kn = strlen(k);
    while (kn && (k[kn - 1] == ' ' || k[kn - 1] == '\t')) kn--;
    int ok = 0;
    for (int i = 0; i < srv->opts.n_api_keys; i++) {
        const char *s = srv->api_keys[i];
        size_t sn = strlen(s);
        unsigned char diff = (unsigned char)(sn != kn);
        for (size_t j = 0; j < kn; j++) diff |= (unsigned char)(k[j] ^ (j < sn ? s[j] : 0));
        ok |= !diff;
    }
    return ok;
}

int srv_req_route(srv_req *r, const char *method, const char *path, const char *auth, long long content_length) {
    squad_server *srv = r->srv;
    size_t plen = strcspn(path, "?");
    const route *rt = NULL;
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
        if (strlen(ROUTES[i].path) == plen && !memcmp(ROUTES[i].path, path, plen)) rt = &ROUTES[i];
    if (!rt) {
        srv_fail(r, 404, NULL, "no such path: %.*s (see GET /v1/models, POST /v1/ask, /v1/score, /v1/decisions, "
                 "/v1/systemone)", (int)(plen > 200 ? 200 : plen), path);
        return 1;
    }
    r->ep = rt->ep;
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    r->is_post = !strcmp(method, "POST");
    if (rt->post ? !r->is_post : !is_get) {
        r->allow = rt->post ? "POST" : "GET, HEAD";
        srv_fail(r, 405, NULL, "%s does not take %.20s; use %s", rt->path, method, rt->post ? "POST" : "GET");
        return 1;
    }
    if (!rt->open && !key_ok(srv, auth)) {
        srv_fail(r, 401, NULL, auth ? "the API key is not valid" : "missing API key: send Authorization: Bearer KEY");
        return 1;
    }
    if (rt->post && content_length > (long long)srv->opts.max_body) {
        srv_fail(r, 413, NULL, "the body is %lld bytes; --max-body is %zu", content_length, srv->opts.max_body);
        return 1;
    }
    if (atomic_load(&srv->stopping) && rt->post) {
        srv_fail(r, 503, NULL, "the server is shutting down");
        return 1;
    }
    return 0;
}

int srv_req_prepare(srv_req *r) {
    squad_server *srv = r->srv;
    if (r->state == SRV_REQ_ANSWERED) return 1;
    if (r->too_big) {
        if (r->too_big == 2) srv_fail(r, 500, NULL, "out of memory reading the body");
        else srv_fail(r, 413, NULL, "the body is over --max-body (%zu bytes)", srv->opts.max_body);
        return 1;
    }
    if (srv_ops_endpoint(r->ep)) return srv_ops_prepare(r);
    if (srv_memo_lookup(r)) return 1;
    squad_err eerr = {0};
    int ready = srv->jobs ? srv_jobs_ready(srv->jobs, &eerr) : 0;
    if (ready == 0) {
        srv_fail(r, 503, NULL, "the model is still loading (GET /ready answers 200 once it is ready); retry shortly");
        return 1;
    }
    if (ready < 0) {
        srv_fail(r, 500, NULL, "the engine could not be created: %s", eerr.msg);
        return 1;
    }
    int answered = r->ep == SRV_EP_ASK     ? srv_ask_prepare(r)
                   : r->ep == SRV_EP_SCORE ? srv_score_prepare(r)
                                           : srv_decision_prepare(r);
    if (answered) return 1;
    r->memo_ok = 1;
    if (r->job.n_rows == 0) { /* nothing for the engine (every score row failed validation) */
        r->job.status = SRV_JOB_OK;
        srv_req_finish(r);
        return 1;
    }
    return 0;
}

/* The cancel check's peek: a socket that reads end-of-file or an error has lost its client. */
static int client_gone(void *ctx) {
    srv_req *r = ctx;
    if (r->client_fd < 0) return 0;
    char c;
    ssize_t n = recv(r->client_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return 1;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

int srv_req_submit(srv_req *r) {
    squad_server *srv = r->srv;
    srv_job *j = &r->job;
    j->rows = r->row_ptrs;
    j->results = r->results;
    j->errs = r->errs;
    j->deadline = srv->opts.timeout_s > 0 ? r->t0 + srv->opts.timeout_s : 0;
    j->client_gone = client_gone;
    j->client_ctx = r;
    j->done = r->wake; /* the transport's: nothing here touches the request once the job is done */
    j->owner = r;
    r->state = SRV_REQ_PENDING;
    if (!srv->jobs || srv_jobs_submit(srv->jobs, j) < 0) {
        r->state = SRV_REQ_NEW;
        if (atomic_load(&srv->stopping)) srv_fail(r, 503, NULL, "the server is shutting down");
        else srv_fail(r, 503, NULL, "the queue is full (--queue %d requests waiting); retry shortly", srv->opts.queue);
        return 1;
    }
    atomic_fetch_add_explicit(&srv->metrics.rows_submitted, (uint64_t)j->n_rows, memory_order_relaxed);
    return 0;
}

void srv_req_finish(srv_req *r) {
    srv_job *j = &r->job;
    /* however the job ended (even a timeout, or an answer), a client already gone is counted so */
    if (client_gone(r)) r->client_left = 1;
    switch (j->status) {
    case SRV_JOB_OK: break;
    case SRV_JOB_TIMEOUT:
        srv_fail(r, 503, NULL, "the request took longer than --timeout (%g s) waiting and running", r->srv->opts.timeout_s);
        return;
    case SRV_JOB_CANCELLED:
        r->client_left = 1;
        srv_fail(r, 503, NULL, "the request was cancelled: its client disconnected");
        return;
    case SRV_JOB_SHUTDOWN: srv_fail(r, 503, NULL, "the server is shutting down"); return;
    case SRV_JOB_FAILED:
    default: srv_fail(r, 500, NULL, "the engine failed: %s", r->errs[0].msg); return;
    }
    if (j->kind == SRV_JOB_CLEAR) {
        srv_answer_status(r, 200, "cleared");
        return;
    }
    if (r->ep != SRV_EP_SCORE)
        for (int i = 0; i < j->n_rows; i++)
            if (r->errs[i].code) {
                srv_fail(r, r->errs[i].code == SQUAD_E_INVALID ? (r->ep == SRV_EP_ASK ? 422 : 400) : 500, NULL, "%s",
                         r->errs[i].msg);
                return;
            }
    if (r->ep == SRV_EP_ASK) srv_ask_render(r);
    else if (r->ep == SRV_EP_SCORE) srv_score_render(r);
    else srv_decision_render(r);
}
