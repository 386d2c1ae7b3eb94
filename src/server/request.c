/*
 * request.c — one request's object (request.h): made, fed its body, given its work arrays, answered
 * (srv_answer, and srv_fail in the endpoint's error format: docs/decisions-api.md section F on the
 * decision endpoints), and ended (the metrics, the log line, free). Also the server's log line.
 */
#include "server/request.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "answer_json.h"

void srv_log(squad_server *srv, const char *fmt, ...) {
    if (!srv->opts.log) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    srv->opts.log(srv->opts.log_ctx, line);
}

void srv_answer(srv_req *r, int status, char *body, size_t len, const char *ctype) {
    free(r->resp);
    r->status = status;
    r->resp = body;
    r->resp_len = len;
    r->ctype = ctype;
    r->state = SRV_REQ_ANSWERED;
}

void srv_answer_buf(srv_req *r, int status, squad_buf *b, const char *ctype) {
    size_t len = 0;
    char *text = squad_buf_take(b, &len);
    if (!text) {
        static const char oom[] = "{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\"}}";
        text = strdup(oom);
        len = text ? sizeof oom - 1 : 0;
        status = 500;
    }
    srv_answer(r, status, text, len, ctype);
}

static int is_decision_ep(srv_endpoint ep) { return ep == SRV_EP_DECISIONS || ep == SRV_EP_SYSTEMONE; }

static const char *status_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 405: return "method_not_allowed";
    case 500: return "server_error";
    case 501: return "not_implemented";
    case 503: return "service_unavailable";
    default: return "invalid_request_error";
    }
}

/* An error in the endpoint's format: {"error": {"message", "type", "param", "code"}} on the decision
 * endpoints, {"error": {"message", "type"}} on squad's own and the rest. */
void srv_fail(srv_req *r, int status, const char *param, const char *fmt, ...) SQUAD_PRINTF(4, 5);
void srv_fail(srv_req *r, int status, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (status == 503) r->retry_after = SRV_RETRY_AFTER_S;
    if (is_decision_ep(r->ep)) {
        squad_dapi_error de;
        squad_dapi_error_set(&de, status, param, "%s", msg);
        char *body = squad_dapi_error_body(&de);
        srv_answer(r, status, body, body ? strlen(body) : 0, SRV_CT_JSON);
        if (!body) r->status = 500;
        return;
    }
    squad_buf b = {0};
    squad_buf_puts(&b, "{\"error\": {\"message\": ");
    squad_buf_json_string(&b, msg);
    squad_buf_puts(&b, ", \"type\": ");
    squad_buf_json_string(&b, status_type(status));
    squad_buf_puts(&b, "}}");
    srv_answer_buf(r, status, &b, SRV_CT_JSON);
}

void srv_fail_dapi(srv_req *r, const squad_dapi_error *de) {
    if (de->status == 503) r->retry_after = SRV_RETRY_AFTER_S;
    char *body = squad_dapi_error_body(de);
    srv_answer(r, body ? de->status : 500, body, body ? strlen(body) : 0, SRV_CT_JSON);
}

srv_req *srv_req_new(squad_server *srv) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->srv = srv;
    r->t0 = squad_now_seconds();
    r->client_fd = -1;
    r->ep = SRV_EP_OTHER;
    atomic_fetch_add(&srv->metrics.in_flight, 1);
    return r;
}

int srv_req_hold_body(srv_req *r, size_t n) {
    squad_server *srv = r->srv;
    size_t held = atomic_load(&srv->body_reserved);
    do {
        if (n > srv->body_budget || held > srv->body_budget - n) return -1;
    } while (!atomic_compare_exchange_weak(&srv->body_reserved, &held, held + n));
    r->body_held += n;
    return 0;
}

/* Copies a session key for the log: at most SRV_SESSION_LOG_MAX characters, anything that could
 * break the line (a quote, a control byte, a non-ASCII byte) as '?'. */
static void session_copy(char *out, size_t cap, const char *key) {
    size_t n = 0;
    for (; key && key[n] && n + 1 < cap; n++) {
        const unsigned char ch = (unsigned char)key[n];
        out[n] = ch < 0x20 || ch >= 0x7f || ch == '"' || ch == '\\' ? '?' : (char)ch;
    }
    out[n] = 0;
}

void srv_req_set_session_header(srv_req *r, const char *value) {
    session_copy(r->session_header, sizeof r->session_header, value);
}

/* The session key the request names, in docs/scale.md's precedence: the header, else the first of
 * the body's SRV_SESSION_FIELDS that is a string; "" without one. Read for the log line only (the
 * body parsed again then, so a request that is not logged pays nothing): no answer depends on it. */
static void request_session(const srv_req *r, char *out, size_t cap) {
    out[0] = 0;
    if (r->session_header[0]) {
        session_copy(out, cap, r->session_header);
        return;
    }
    if (!r->body.n) return;
    json_t *root = json_loadb(srv_req_body_text(r), r->body.n, 0, NULL);
    static const char *const fields[] = SRV_SESSION_FIELDS;
    for (size_t i = 0; json_is_object(root) && i < sizeof fields / sizeof fields[0]; i++) {
        json_t *v = json_object_get(root, fields[i]);
        if (json_is_string(v)) {
            session_copy(out, cap, json_string_value(v));
            break;
        }
    }
    json_decref(root);
}

void srv_req_body(srv_req *r, const char *data, size_t n) {
    if (r->too_big || r->state != SRV_REQ_NEW) return;
    if (r->body.n + n > r->srv->opts.max_body) {
        r->too_big = 1;
        return;
    }
    /* a body longer than it declared (or one that declared nothing) holds the rest as it comes */
    if (r->body.n + n > r->body_held && srv_req_hold_body(r, r->body.n + n - r->body_held) < 0) {
        r->too_big = 3;
        return;
    }
    if (squad_buf_put(&r->body, data, n) < 0) r->too_big = 2;
}

/* Arrays for n rows of work. */
int srv_req_alloc_work(srv_req *r, int n) {
    size_t k = n > 0 ? (size_t)n : 1;
    r->row_ptrs = calloc(k, sizeof *r->row_ptrs);
    r->results = calloc(k, sizeof *r->results);
    r->errs = calloc(k, sizeof *r->errs);
    if (!r->row_ptrs || !r->results || !r->errs) {
        srv_fail(r, 500, NULL, "out of memory for %d rows", n);
        return -1;
    }
    return 0;
}

void srv_answer_status(srv_req *r, int status, const char *text) {
    squad_buf b = {0};
    squad_buf_printf(&b, "{\"status\": \"%s\"}", text);
    srv_answer_buf(r, status, &b, SRV_CT_JSON);
}

void srv_req_end(srv_req *r, int delivered) {
    squad_server *srv = r->srv;
    double dt = squad_now_seconds() - r->t0;
    if ((!delivered || r->client_left) && r->status) r->status = SRV_STATUS_CLIENT_CLOSED;
    if (r->status) srv_metrics_request(&srv->metrics, r->ep, r->status, dt);
    if (srv->opts.log_requests || r->status >= 500)
    {
        /* the engine's share: from the scheduler taking the request to its rows' end, in steps that
         * ran its tokens and steps that ran others' only; before it, parsing and the queue */
        const int ran = r->job.t_start > 0;
        const double engine_ms = ran && r->job.t_end > r->job.t_start ? (r->job.t_end - r->job.t_start) * 1000.0 : 0.0;
        const double before_ms = ran ? (r->job.t_start - r->t0) * 1000.0 : 0.0;
        uint64_t computed = 0, reused = 0;
        for (int i = 0; ran && r->job.results && i < r->job.n_rows; i++) {
            computed += (uint64_t)r->job.results[i].computed;
            reused += (uint64_t)r->job.results[i].reused;
        }
        char session[SRV_SESSION_LOG_MAX + 1], named[SRV_SESSION_LOG_MAX + 16] = "";
        request_session(r, session, sizeof session);
        if (session[0]) snprintf(named, sizeof named, " session \"%s\"", session);
        if (!ran) /* answered without the engine (the request memo, stats, an error) */
            srv_log(srv, "%s %d %.2f ms%s%s", SRV_EP_PATH[r->ep], r->status, dt * 1000.0, r->memo_hit ? " memo" : "",
                    named);
        else
            srv_log(srv, "%s %d %.2f ms (before the engine %.2f ms, engine %.2f ms: %d steps ran its rows, %d ran"
                    " others' only, the longest %.2f ms; %" PRIu64 " tokens computed, %" PRIu64 " reused)%s",
                    SRV_EP_PATH[r->ep], r->status, dt * 1000.0, before_ms, engine_ms, r->job.steps_ran,
                    r->job.steps_waited, r->job.longest_step_s * 1000.0, computed, reused, named);
    }
    squad_buf_free(&r->body);
    atomic_fetch_sub(&srv->body_reserved, r->body_held);
    if (r->submitted) atomic_fetch_sub(&srv->in_engine, 1);
    free(r->resp);
    free(r->row_ptrs);
    free(r->results);
    free(r->errs);
    squad_text_rows_free(&r->ask);
    for (int i = 0; r->score_rows && i < r->n_score; i++) squad_row_buf_free(&r->score_rows[i]);
    free(r->score_rows);
    free(r->score_errs);
    squad_dapi_req_free(r->dreq);
    atomic_fetch_sub(&srv->metrics.in_flight, 1);
    free(r);
}
