/*
 * server.c — the request core of `squad serve` (see internal.h for a request's life, docs/server.md
 * for the service): routing, keys, the request memo, each endpoint's parsing and answer, errors
 * exactly as DECISIONS-API.md section F says, and the in-process entry squad_server_handle.
 *
 * Connection threads do everything here except scoring: a request that needs the engine becomes a
 * job for the scheduler (sched.h) and its answer is rendered when the job is done, again on a
 * connection thread.
 *
 * The request memo (section G) keys an exact body on its endpoint. What it stores is the answer as
 * the memo will say it (usage all cached, "memo": true) with the per-call fields cut out as holes:
 * [u32 n_holes][n_holes x (u32 offset, u32 kind)][text]. A hit copies the text, filling each hole
 * (a new id, the time, the elapsed ms), so it costs a hash, a compare and a copy.
 */
#define _GNU_SOURCE /* memmem, usleep */
#include "server/internal.h"

#include "hash_index.h"
#include "json_text.h"
#include "server/token_cache.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Retry-After (seconds) for a full queue and for a request that ran out of time. */
#define SRV_RETRY_AFTER_S 1

static const char CT_JSON[] = "application/json";
static const char CT_PROM[] = "text/plain; version=0.0.4; charset=utf-8";

void srv_log(squad_server *srv, const char *fmt, ...) {
    if (!srv->opts.log) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    srv->opts.log(srv->opts.log_ctx, line);
}

static void sched_log_cb(void *ctx, const char *line) { srv_log(ctx, "%s", line); }

/* ---------------------------------------------------------------------------------------------
 * The server object
 * ------------------------------------------------------------------------------------------- */

void squad_server_opts_default(squad_server_opts *o) {
    memset(o, 0, sizeof *o);
    squad_engine_opts_default(&o->engine);
    o->engine.cache.budget_bytes = SQUAD_CACHE_BUDGET_AUTO;
    o->engine.precapture = 1; /* the first request must not pay the graphs' capture */
    o->port = SQUAD_SERVE_PORT;
    o->memo_bytes = (size_t)SQUAD_SERVE_MEMO_MB << 20;
    o->token_cache_bytes = (size_t)SQUAD_SERVE_TOKEN_CACHE_MB << 20;
    o->queue = SQUAD_SERVE_QUEUE;
    o->max_body = SQUAD_SERVE_MAX_BODY;
    o->max_questions = SQUAD_SERVE_MAX_QUESTIONS;
    o->timeout_s = SQUAD_SERVE_TIMEOUT_S;
}

/* The last path component of dir (trailing slashes ignored). */
static char *dir_basename(const char *dir, squad_err *err) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/') s--;
    char *out = squad_malloc(n - s + 1, err);
    if (!out) return NULL;
    memcpy(out, dir + s, n - s);
    out[n - s] = 0;
    if (!out[0]) {
        free(out);
        return squad_strdup("model", err);
    }
    return out;
}

/* A random nonce for the memo's holes: request text cannot guess it, so it cannot fake a hole. */
static void make_nonce(char *out, size_t cap) {
    uint64_t a = 0, b = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&a, sizeof a, 1, f) != 1) a = 0;
        if (fread(&b, sizeof b, 1, f) != 1) b = 0;
        fclose(f);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    a ^= (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull;
    b ^= (uint64_t)getpid() << 20 ^ (uint64_t)ts.tv_sec;
    snprintf(out, cap, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

/* The tokenizer (--tokenizer, else DIR/tokenizer.json), the token cache and the template
 * (--template, else DIR/squad-template.json or the default). o is the caller's options: the paths
 * are borrowed for this call only. A path given that cannot be loaded is an error. */
static int load_text_side(squad_server *srv, const squad_server_opts *o, squad_err *err) {
    char *tok_path = o->tokenizer_path ? NULL : squad_path_join(o->model_dir, "tokenizer.json", err);
    if (!o->tokenizer_path && !tok_path) return err->code;
    srv->tok = squad_tokenizer_load(o->tokenizer_path ? o->tokenizer_path : tok_path, err);
    free(tok_path);
    if (!srv->tok) return o->tokenizer_path ? squad_fail_context(err, "--tokenizer %s: ", o->tokenizer_path) : err->code;
    if (o->token_cache_bytes) {
        srv->tokens = squad_lru_map_new(o->token_cache_bytes, SQUAD_LRU_MAP_LOCKED, err);
        if (!srv->tokens) return err->code;
        srv_token_cache_attach(srv->tok, srv->tokens, SRV_TOKEN_CACHE_MIN_BYTES);
    }
    srv->tpl = o->template_path ? squad_template_load_file(o->template_path, err)
                                : squad_template_load_dir(o->model_dir, err);
    if (!srv->tpl) return o->template_path ? squad_fail_context(err, "--template %s: ", o->template_path) : err->code;
    return 0;
}

/* Called on the scheduler thread once the engine exists, before /ready says yes: the longest row is
 * the engine's (the model's positions, --max-tokens, or what the device's memory holds), so the
 * decision APIs' context, which bounds rows by it, is made now. Requests that need either wait for
 * ready (srv_req_prepare answers 503 before it), which publishes what this sets. */
static int on_engine_ready(void *ctx, squad_engine *engine, squad_err *err) {
    squad_server *srv = ctx;
    squad_limit why = SQUAD_LIMIT_MODEL;
    srv->max_tokens = squad_engine_max_tokens(engine, &why);
    if (why == SQUAD_LIMIT_MEMORY)
        srv_log(srv, "rows up to %d tokens: bounded by memory, not the model (%d positions)", srv->max_tokens,
                squad_model_max_tokens(srv->model));
    /* The decision APIs' model names: each route's label forces that route (the trunk's label the
       trunk alone), as vLLM names LoRA adapters; the served name lets the router decide. Route i
       is name i, so a request's specialist index + 1 is its row's specialist. */
    const char *names[SQUAD_MAX_ROUTES];
    int n_names = srv->sp ? squad_specialists_count(srv->sp) : 0;
    if (n_names > SQUAD_MAX_ROUTES) n_names = SQUAD_MAX_ROUTES;
    for (int i = 0; i < n_names; i++) names[i] = squad_specialists_label(srv->sp, i);
    srv->dapi = squad_dapi_ctx_new(srv->tok, srv->served_name, n_names ? names : NULL, n_names, srv->max_tokens, err);
    if (!srv->dapi) return err->code ? err->code : SQUAD_E_NOMEM;
    for (int a = 0; a < SQUAD_DAPI_COUNT; a++) {
        const char *off = squad_dapi_disabled(srv->dapi, (squad_dapi)a);
        if (off) srv_log(srv, "%s is disabled for this tokenizer: %s", a == SQUAD_DAPI_DECISIONS ? "/v1/decisions" : "/v1/systemone", off);
    }
    return 0;
}

squad_server *squad_server_new(const squad_server_opts *opts, squad_err *err) {
    if (!opts->model_dir) {
        squad_fail(err, SQUAD_E_INVALID, "no model directory");
        return NULL;
    }
    squad_server *srv = squad_calloc(1, sizeof *srv, err);
    if (!srv) return NULL;
    srv->opts = *opts;
    srv->t_start = squad_now_seconds();
    srv->created_unix = (long)time(NULL);
    make_nonce(srv->hole_nonce, sizeof srv->hole_nonce);
    srv->model_dir = squad_strdup(opts->model_dir, err);
    srv->served_name = opts->served_name ? squad_strdup(opts->served_name, err) : dir_basename(opts->model_dir, err);
    if (!srv->model_dir || !srv->served_name) goto fail;
    if (opts->host && !(srv->listen_host = squad_strdup(opts->host, err))) goto fail;
    srv->opts.model_dir = srv->model_dir;
    srv->opts.served_name = srv->served_name;
    if (opts->n_api_keys > 0) {
        srv->api_keys = squad_calloc((size_t)opts->n_api_keys, sizeof(char *), err);
        if (!srv->api_keys) goto fail;
        for (int i = 0; i < opts->n_api_keys; i++)
            if (!(srv->api_keys[i] = squad_strdup(opts->api_keys[i], err))) goto fail;
        srv->opts.api_keys = (const char *const *)srv->api_keys;
    }
    srv->opts.host = NULL; /* borrowed strings are not kept past this call */
    srv->opts.specialists_dir = NULL;
    srv->opts.tokenizer_path = srv->opts.template_path = NULL;
    /* The release date /v1/models lists: the day config.json was written. */
    char *cfg = squad_path_join(opts->model_dir, "config.json", err);
    struct stat st;
    if (cfg && stat(cfg, &st) == 0) {
        struct tm tm;
        gmtime_r(&st.st_mtime, &tm);
        strftime(srv->release_date, sizeof srv->release_date, "%Y-%m-%d", &tm);
    }
    free(cfg);
    if (load_text_side(srv, opts, err) < 0) goto fail;
    srv->model = squad_model_load(opts->model_dir, err);
    if (!srv->model) goto fail;
    if (squad_tokenizer_vocab_size(srv->tok) > squad_model_vocab_size(srv->model)) {
        squad_fail(err, SQUAD_E_MODEL, "the tokenizer has %d token ids but the model's vocabulary has %d: they do not "
                   "belong together", squad_tokenizer_vocab_size(srv->tok), squad_model_vocab_size(srv->model));
        goto fail;
    }
    if (opts->specialists_dir) {
        srv->sp = squad_specialists_load(srv->model, opts->specialists_dir, err);
        if (!srv->sp) goto fail;
        srv_log(srv, "specialists from %s: %d routes, the router decides unless a request names one",
                opts->specialists_dir, squad_specialists_count(srv->sp));
    }
    srv->opts.engine.specialists = srv->sp;
    if (opts->memo_bytes && !(srv->memo = squad_lru_map_new(opts->memo_bytes, SQUAD_LRU_MAP_LOCKED, err))) goto fail;
    srv->sched = srv_sched_start(srv->model, &srv->opts.engine, opts->queue > 0 ? opts->queue : 1, sched_log_cb,
                                 on_engine_ready, srv, err);
    if (!srv->sched) goto fail;
    return srv;
fail:
    squad_server_free(srv);
    return NULL;
}

int squad_server_listen(squad_server *srv, squad_err *err) {
    return srv_http_start(srv, err);
}

int squad_server_port(const squad_server *srv) { return srv->port; }

int squad_server_ready(squad_server *srv) { return srv_sched_ready(srv->sched, NULL); }

void squad_server_shutdown(squad_server *srv, double grace_s) {
    if (!srv || srv->shut_down) return;
    srv->shut_down = 1;
    atomic_store(&srv->stopping, 1);
    if (srv->daemon) srv_http_quiesce(srv);
    /* In-flight requests finish while the scheduler still runs (bounded by grace_s) ... */
    double until = squad_now_seconds() + grace_s;
    while (atomic_load(&srv->metrics.in_flight) > 0 && squad_now_seconds() < until) usleep(2000);
    /* ... then the scheduler answers what is left (503) and stops; the daemon sends those answers. */
    srv_sched_stop(srv->sched, 0);
    srv->sched = NULL;
    until = squad_now_seconds() + 2.0;
    while (srv->daemon && atomic_load(&srv->metrics.in_flight) > 0 && squad_now_seconds() < until) usleep(2000);
    if (srv->daemon) srv_http_stop(srv);
}

void squad_server_free(squad_server *srv) {
    if (!srv) return;
    squad_server_shutdown(srv, 0);
    squad_dapi_ctx_free(srv->dapi);
    squad_specialists_free(srv->sp); /* after the engine (the scheduler freed it) */
    squad_model_free(srv->model);
    squad_template_free(srv->tpl);
    squad_tokenizer_free(srv->tok);
    squad_lru_map_free(srv->tokens);
    squad_lru_map_free(srv->memo);
    for (int i = 0; srv->api_keys && i < srv->opts.n_api_keys; i++) free(srv->api_keys[i]);
    free(srv->api_keys);
    free(srv->served_name);
    free(srv->model_dir);
    free(srv->listen_host);
    free(srv);
}

/* ---------------------------------------------------------------------------------------------
 * Answers and errors
 * ------------------------------------------------------------------------------------------- */

static void answer(srv_req *r, int status, char *body, size_t len, const char *ctype) {
    free(r->resp);
    r->status = status;
    r->resp = body;
    r->resp_len = len;
    r->ctype = ctype;
    r->state = SRV_REQ_ANSWERED;
}

static void answer_buf(srv_req *r, int status, squad_buf *b, const char *ctype) {
    size_t len = 0;
    char *text = squad_buf_take(b, &len);
    if (!text) {
        static const char oom[] = "{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\"}}";
        text = strdup(oom);
        len = text ? sizeof oom - 1 : 0;
        status = 500;
    }
    answer(r, status, text, len, ctype);
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
static void fail_req(srv_req *r, int status, const char *param, const char *fmt, ...) SQUAD_PRINTF(4, 5);
static void fail_req(srv_req *r, int status, const char *param, const char *fmt, ...) {
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
        answer(r, status, body, body ? strlen(body) : 0, CT_JSON);
        if (!body) r->status = 500;
        return;
    }
    squad_buf b = {0};
    squad_buf_puts(&b, "{\"error\": {\"message\": ");
    squad_buf_json_string(&b, msg);
    squad_buf_puts(&b, ", \"type\": ");
    squad_buf_json_string(&b, status_type(status));
    squad_buf_puts(&b, "}}");
    answer_buf(r, status, &b, CT_JSON);
}

static void fail_dapi(srv_req *r, const squad_dapi_error *de) {
    if (de->status == 503) r->retry_after = SRV_RETRY_AFTER_S;
    char *body = squad_dapi_error_body(de);
    answer(r, body ? de->status : 500, body, body ? strlen(body) : 0, CT_JSON);
}

/* ---------------------------------------------------------------------------------------------
 * Requests: routing, keys, bodies
 * ------------------------------------------------------------------------------------------- */

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
        fail_req(r, 404, NULL, "no such path: %.*s (see GET /v1/models, POST /v1/ask, /v1/score, /v1/decisions, "
                 "/v1/systemone)", (int)(plen > 200 ? 200 : plen), path);
        return 1;
    }
    r->ep = rt->ep;
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    r->is_post = !strcmp(method, "POST");
    if (rt->post ? !r->is_post : !is_get) {
        r->allow = rt->post ? "POST" : "GET, HEAD";
        fail_req(r, 405, NULL, "%s does not take %.20s; use %s", rt->path, method, rt->post ? "POST" : "GET");
        return 1;
    }
    if (!rt->open && !key_ok(srv, auth)) {
        fail_req(r, 401, NULL, auth ? "the API key is not valid" : "missing API key: send Authorization: Bearer KEY");
        return 1;
    }
    if (rt->post && content_length > (long long)srv->opts.max_body) {
        fail_req(r, 413, NULL, "the body is %lld bytes; --max-body is %zu", content_length, srv->opts.max_body);
        return 1;
    }
    if (atomic_load(&srv->stopping) && rt->post) {
        fail_req(r, 503, NULL, "the server is shutting down");
        return 1;
    }
    return 0;
}

void srv_req_body(srv_req *r, const char *data, size_t n) {
    if (r->too_big || r->state != SRV_REQ_NEW) return;
    if (r->body.n + n > r->srv->opts.max_body) {
        r->too_big = 1;
        return;
    }
    if (squad_buf_put(&r->body, data, n) < 0) r->too_big = 2;
}

/* The body as text ("" before any byte came). */
static const char *body_text(const srv_req *r) { return r->body.s ? r->body.s : ""; }

/* ---------------------------------------------------------------------------------------------
 * The request memo
 * ------------------------------------------------------------------------------------------- */

enum { HOLE_MS = 1, HOLE_ID = 2, HOLE_CREATED = 3 };
#define MEMO_MAX_HOLES 8

typedef struct memo_fill {
    srv_req *r;
    char *out;
    size_t len;
} memo_fill;

static size_t hole_text(srv_req *r, int kind, char *buf, size_t cap) {
    switch (kind) {
    case HOLE_MS: return (size_t)snprintf(buf, cap, "%.1f", 1000.0 * (squad_now_seconds() - r->t0));
    case HOLE_CREATED: return (size_t)snprintf(buf, cap, "%ld", (long)time(NULL));
    default:
        return (size_t)snprintf(buf, cap, "\"decision-%s%012llx\"", r->srv->hole_nonce + 16,
                                (unsigned long long)atomic_fetch_add(&r->srv->next_id, 1));
    }
}

/* The map's use of a hit: the stored text with its holes filled. */
static int memo_copy(void *ctx, const void *val, size_t vlen) {
    memo_fill *f = ctx;
    const unsigned char *v = val;
    uint32_t nh;
    memcpy(&nh, v, 4);
    size_t head = 4 + (size_t)nh * 8;
    if (nh > MEMO_MAX_HOLES || head > vlen) return -2;
    const char *text = (const char *)v + head;
    size_t tlen = vlen - head;
    char *out = malloc(tlen + (size_t)nh * 64 + 1);
    if (!out) return -2;
    size_t o = 0, at = 0;
    for (uint32_t i = 0; i < nh; i++) {
        uint32_t off, kind;
        memcpy(&off, v + 4 + i * 8, 4);
        memcpy(&kind, v + 8 + i * 8, 4);
        memcpy(out + o, text + at, off - at);
        o += off - at;
        at = off;
        o += hole_text(f->r, (int)kind, out + o, 64);
    }
    memcpy(out + o, text + at, tlen - at);
    o += tlen - at;
    out[o] = 0;
    f->out = out;
    f->len = o;
    return 1;
}

/* The memo's key: the endpoint, then the body. */
static void memo_key(srv_req *r, squad_bytes key[2]) {
    r->memo_tag = (uint32_t)r->ep;
    key[0] = (squad_bytes){&r->memo_tag, sizeof r->memo_tag};
    key[1] = (squad_bytes){body_text(r), r->body.n};
}

/* 1 when the memo answered r. */
static int memo_lookup(srv_req *r) {
    squad_server *srv = r->srv;
    if (!srv->memo) return 0;
    squad_bytes key[2];
    memo_key(r, key);
    r->memo_hash = squad_hash_bytes((uint32_t)r->ep, key[1].p, key[1].n);
    memo_fill f = {r, NULL, 0};
    int rc = squad_lru_map_get(srv->memo, r->memo_hash, key, 2, memo_copy, &f);
    if (rc != 1) {
        atomic_fetch_add_explicit(&srv->metrics.memo_misses, 1, memory_order_relaxed);
        return 0;
    }
    atomic_fetch_add_explicit(&srv->metrics.memo_hits, 1, memory_order_relaxed);
    r->memo_hit = 1;
    answer(r, 200, f.out, f.len, CT_JSON);
    return 1;
}

/* The memo's text of an answer: placeholders "<nonce>-<kind>" (with their quotes) become holes. */
static void memo_store(srv_req *r, const char *text, size_t len) {
    squad_server *srv = r->srv;
    if (!srv->memo || !r->memo_ok) return;
    char pat[64];
    uint32_t holes[MEMO_MAX_HOLES][2];
    uint32_t nh = 0;
    squad_buf out = {0};
    size_t at = 0;
    int plen = snprintf(pat, sizeof pat, "\"%s-", srv->hole_nonce);
    while (at < len) {
        const char *p = memmem(text + at, len - at, pat, (size_t)plen);
        if (!p || nh == MEMO_MAX_HOLES) break;
        const char *kind = p + plen;
        const char *end = memchr(kind, '"', (size_t)(text + len - kind));
        if (!end) break;
        squad_buf_put(&out, text + at, (size_t)(p - (text + at)));
        holes[nh][0] = (uint32_t)out.n;
        holes[nh][1] = (uint32_t)atoi(kind);
        nh++;
        at = (size_t)(end + 1 - text);
    }
    squad_buf_put(&out, text + at, len - at);
    if (out.oom || out.n > UINT32_MAX) {
        squad_buf_free(&out);
        return;
    }
    squad_bytes key[2];
    memo_key(r, key);
    const squad_bytes val[3] = {{&nh, 4}, {holes, (size_t)nh * 8}, {out.s, out.n}};
    squad_lru_map_put(srv->memo, r->memo_hash, key, 2, val, 3, NULL); /* a cache may forget */
    squad_buf_free(&out);
}

/* A placeholder the memo turns into a hole (a JSON string: "<nonce>-<kind>"). */
static void hole(squad_buf *b, const squad_server *srv, int kind) {
    squad_buf_printf(b, "\"%s-%d\"", srv->hole_nonce, kind);
}

/* ---------------------------------------------------------------------------------------------
 * Endpoints without the engine
 * ------------------------------------------------------------------------------------------- */

static void view_of(squad_server *srv, srv_metrics_view *v) {
    memset(v, 0, sizeof *v);
    v->m = &srv->metrics;
    v->sp = srv->sp;
    if (srv->sched) srv_sched_get_stats(srv->sched, &v->sched);
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
    answer_buf(r, 200, &b, CT_JSON);
}

static void answer_status(srv_req *r, int status, const char *text) {
    squad_buf b = {0};
    squad_buf_printf(&b, "{\"status\": \"%s\"}", text);
    answer_buf(r, status, &b, CT_JSON);
}

/* ---------------------------------------------------------------------------------------------
 * Endpoints with the engine: preparing the job
 * ------------------------------------------------------------------------------------------- */

/* Arrays for n rows of work. */
static int alloc_work(srv_req *r, int n) {
    size_t k = n > 0 ? (size_t)n : 1;
    r->row_ptrs = calloc(k, sizeof *r->row_ptrs);
    r->results = calloc(k, sizeof *r->results);
    r->errs = calloc(k, sizeof *r->errs);
    if (!r->row_ptrs || !r->results || !r->errs) {
        fail_req(r, 500, NULL, "out of memory for %d rows", n);
        return -1;
    }
    return 0;
}

/* Parses the body once with duplicate keys refused (section F: 400 on the decision endpoints and
 * squad's own): NULL after answering. */
static json_t *parse_strict(srv_req *r) {
    size_t bad = squad_utf8_invalid_offset(body_text(r), r->body.n);
    if (bad < r->body.n) {
        fail_req(r, 400, NULL, "the body is not valid UTF-8 (byte offset %zu)", bad);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(body_text(r), r->body.n, JSON_REJECT_DUPLICATES, &je);
    if (!root) fail_req(r, 400, NULL, "the body is not valid JSON (line %d, column %d): %s", je.line, je.column, je.text);
    return root;
}

/* The first field an ask request must not have (its path in where), or NULL. The template reads
 * only the fields it knows; the server refuses the rest (section F: 422), so a misspelt field is
 * not silently ignored. */
static const char *ask_unknown_field(json_t *root, char *where, size_t cap) {
    if (!json_is_object(root)) return NULL; /* the template says what is wrong */
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "state") && strcmp(k, "questions") && strcmp(k, "system") && strcmp(k, "specialist")) {
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

static int prepare_ask(srv_req *r) {
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
    json_decref(root);
    if (!unknown && forced < 0) {
        if (forced == -2) fail_req(r, 422, "specialist", "\"specialist\" must be a label or \"auto\"");
        else fail_req(r, 422, "specialist", "%s", serr.msg);
        return 1;
    }
    if (unknown) {
        fail_req(r, 422, where, "unknown field %s (a request has \"state\", \"questions\", \"system\" and "
                 "\"specialist\"; a question \"text\" and \"options\")", where);
        return 1;
    }
    if (nq > (size_t)srv->opts.max_questions) {
        fail_req(r, 422, "questions", "\"questions\" has %zu entries; --max-questions is %d", nq, srv->opts.max_questions);
        return 1;
    }
    squad_err err = {0};
    int rc = squad_template_build(srv->tpl, srv->tok, body_text(r), r->body.n, srv->max_tokens, &r->ask, &err);
    if (rc < 0) {
        if (rc == SQUAD_E_INVALID) fail_req(r, 422, NULL, "%s", err.msg);
        else fail_req(r, 500, NULL, "%s", err.msg);
        return 1;
    }
    for (int i = 0; i < r->ask.n_rows; i++) r->ask.rows[i].specialist = forced;
    for (int i = 0; i < r->ask.n_rows; i++)
        if (squad_row_check(srv->model, &r->ask.rows[i], &err) < 0) {
            fail_req(r, 422, NULL, "%s", err.msg);
            return 1;
        }
    if (alloc_work(r, r->ask.n_rows) < 0) return 1;
    for (int i = 0; i < r->ask.n_rows; i++) r->row_ptrs[i] = &r->ask.rows[i];
    r->job.n_rows = r->ask.n_rows;
    return 0;
}

static int prepare_score(srv_req *r) {
    squad_server *srv = r->srv;
    json_t *root = parse_strict(r);
    if (!root) return 1;
    json_t *rows = json_is_object(root) ? json_object_get(root, "rows") : NULL;
    if (!json_is_array(rows) || json_object_size(root) != 1) {
        json_decref(root);
        fail_req(r, 400, "rows", "the body must be {\"rows\": [row, ...]} with nothing else");
        return 1;
    }
    size_t n = json_array_size(rows);
    if (n > SQUAD_SERVE_MAX_SCORE_ROWS) {
        json_decref(root);
        fail_req(r, 400, "rows", "\"rows\" has %zu rows; at most %d a request", n, SQUAD_SERVE_MAX_SCORE_ROWS);
        return 1;
    }
    r->n_score = (int)n;
    r->score_rows = calloc(n ? n : 1, sizeof *r->score_rows);
    r->score_errs = calloc(n ? n : 1, sizeof *r->score_errs);
    if (!r->score_rows || !r->score_errs || alloc_work(r, (int)n) < 0) {
        json_decref(root);
        if (r->state != SRV_REQ_ANSWERED) fail_req(r, 500, NULL, "out of memory");
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
        if (squad_row_check(srv->model, &r->score_rows[i].row, e) < 0) continue;
        r->row_ptrs[k++] = &r->score_rows[i].row;
    }
    json_decref(root);
    r->job.n_rows = k;
    return 0;
}

static int prepare_dapi(srv_req *r) {
    squad_server *srv = r->srv;
    squad_dapi api = r->ep == SRV_EP_DECISIONS ? SQUAD_DAPI_DECISIONS : SQUAD_DAPI_SYSTEMONE;
    squad_dapi_error de;
    memset(&de, 0, sizeof de);
    const char *why = squad_dapi_disabled(srv->dapi, api);
    if (why) {
        fail_req(r, 501, NULL, "%s", why);
        return 1;
    }
    if (squad_dapi_parse(srv->dapi, api, body_text(r), r->body.n, &r->dreq, &de) < 0) {
        fail_dapi(r, &de);
        return 1;
    }
    if (r->dreq->n_rows > srv->opts.max_questions) {
        fail_req(r, 400, "questions", "the request has %d questions; --max-questions is %d", r->dreq->n_rows,
                 srv->opts.max_questions);
        return 1;
    }
    if (alloc_work(r, r->dreq->n_rows) < 0) return 1;
    /* a model naming a route forces it (the names are the routes' labels in route order) */
    for (int i = 0; i < r->dreq->n_rows; i++) r->dreq->rows[i].specialist = r->dreq->specialist + 1;
    for (int i = 0; i < r->dreq->n_rows; i++) r->row_ptrs[i] = &r->dreq->rows[i];
    r->job.n_rows = r->dreq->n_rows;
    r->job.want_vocab = 1;
    r->job.checkpoints = r->dreq->breakpoints; /* prompt_cache_breakpoint: checkpoints there too */
    r->job.n_checkpoints = r->dreq->n_breakpoints;
    return 0;
}

int srv_req_prepare(srv_req *r) {
    squad_server *srv = r->srv;
    if (r->state == SRV_REQ_ANSWERED) return 1;
    if (r->too_big) {
        if (r->too_big == 2) fail_req(r, 500, NULL, "out of memory reading the body");
        else fail_req(r, 413, NULL, "the body is over --max-body (%zu bytes)", srv->opts.max_body);
        return 1;
    }
    switch (r->ep) {
    case SRV_EP_HEALTH: answer_status(r, 200, "ok"); return 1;
    case SRV_EP_READY: {
        int ready = srv->sched ? srv_sched_ready(srv->sched, NULL) : 0;
        answer_status(r, ready == 1 ? 200 : 503, ready == 1 ? "ready" : ready < 0 ? "failed" : "loading");
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
        answer_buf(r, 200, &b, r->ep == SRV_EP_METRICS ? CT_PROM : CT_JSON);
        return 1;
    }
    case SRV_EP_CACHE_CLEAR:
        if (srv->memo) squad_lru_map_clear(srv->memo);
        if (srv->tokens) squad_lru_map_clear(srv->tokens);
        if (alloc_work(r, 1) < 0) return 1;
        r->job.kind = SRV_JOB_CLEAR;
        return 0;
    default: break;
    }
    if (memo_lookup(r)) return 1;
    squad_err eerr = {0};
    int ready = srv->sched ? srv_sched_ready(srv->sched, &eerr) : 0;
    if (ready == 0) {
        fail_req(r, 503, NULL, "the model is still loading (GET /ready answers 200 once it is ready); retry shortly");
        return 1;
    }
    if (ready < 0) {
        fail_req(r, 500, NULL, "the engine could not be created: %s", eerr.msg);
        return 1;
    }
    int answered = r->ep == SRV_EP_ASK     ? prepare_ask(r)
                   : r->ep == SRV_EP_SCORE ? prepare_score(r)
                                           : prepare_dapi(r);
    if (answered) return 1;
    r->memo_ok = 1;
    if (r->job.n_rows == 0) { /* nothing for the engine (every score row failed validation) */
        r->job.status = SRV_JOB_OK;
        srv_req_finish(r);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The job
 * ------------------------------------------------------------------------------------------- */

/* Completion belongs to the transport's wake: it marks the request done in a way its waiter cannot
   see before the wake is over (the waiter may free the request at once), so nothing here touches the
   request after the call. */
static void job_done(srv_job *job) {
    srv_req *r = job->owner;
    r->wake(r);
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
    j->done = job_done;
    j->owner = r;
    r->state = SRV_REQ_PENDING;
    if (!srv->sched || srv_sched_submit(srv->sched, j) < 0) {
        r->state = SRV_REQ_NEW;
        if (atomic_load(&srv->stopping)) fail_req(r, 503, NULL, "the server is shutting down");
        else fail_req(r, 503, NULL, "the queue is full (--queue %d requests waiting); retry shortly", srv->opts.queue);
        return 1;
    }
    atomic_fetch_add_explicit(&srv->metrics.rows_submitted, (uint64_t)j->n_rows, memory_order_relaxed);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Rendering a finished job
 * ------------------------------------------------------------------------------------------- */

static void finish_ask(srv_req *r) {
    long computed = 0, reused = 0, written = 0, total = 0;
    for (int i = 0; i < r->ask.n_rows; i++) {
        computed += r->results[i].computed;
        reused += r->results[i].reused;
        written += r->results[i].cache_written;
        total += r->ask.rows[i].n_ids;
    }
    squad_buf b = {0}, m = {0};
    squad_ask_json_head(&b, &r->ask, r->results, r->srv->sp, computed, reused);
    squad_buf_printf(&b, ", \"ms\": %.1f, \"memo\": false, \"cache\": {\"reused\": %ld, \"computed\": %ld, \"written\": %ld}}",
                     1000.0 * (squad_now_seconds() - r->t0), reused, computed, written);
    if (r->srv->memo) {
        squad_ask_json_head(&m, &r->ask, r->results, r->srv->sp, 0, total);
        squad_buf_puts(&m, ", \"ms\": ");
        hole(&m, r->srv, HOLE_MS);
        squad_buf_printf(&m, ", \"memo\": true, \"cache\": {\"reused\": %ld, \"computed\": 0, \"written\": 0}}", total);
        if (!m.oom) memo_store(r, m.s, m.n);
        squad_buf_free(&m);
    }
    answer_buf(r, 200, &b, CT_JSON);
}

static void score_results(squad_buf *b, srv_req *r, int from_memo) {
    squad_buf_puts(b, "{\"results\": [");
    int k = 0;
    for (int i = 0; i < r->n_score; i++) {
        if (i) squad_buf_puts(b, ", ");
        if (r->score_errs[i].code) {
            squad_score_error_json(b, r->score_errs[i].msg);
            continue;
        }
        int j = k++;
        if (r->errs[j].code) {
            squad_score_error_json(b, r->errs[j].msg);
            continue;
        }
        squad_result res = r->results[j];
        if (from_memo) {
            res.reused = r->row_ptrs[j]->n_ids;
            res.computed = 0;
        }
        squad_score_result_json(b, r->row_ptrs[j], &res, r->srv->sp);
    }
    squad_buf_printf(b, "], \"memo\": %s}", from_memo ? "true" : "false");
}

static void finish_score(srv_req *r) {
    squad_buf b = {0};
    score_results(&b, r, 0);
    if (r->srv->memo) {
        squad_buf m = {0};
        score_results(&m, r, 1);
        if (!m.oom) memo_store(r, m.s, m.n);
        squad_buf_free(&m);
    }
    answer_buf(r, 200, &b, CT_JSON);
}

/* The decision response as text; with holes for the memo's copy. */
static char *dapi_text(srv_req *r, int from_memo, size_t *len) {
    squad_err err = {0};
    json_t *resp = squad_dapi_respond(r->dreq, r->results, from_memo, &err);
    if (!resp) return NULL;
    if (from_memo) {
        char ph[64];
        if (json_object_get(resp, "id")) {
            snprintf(ph, sizeof ph, "%s-%d", r->srv->hole_nonce, HOLE_ID);
            json_object_set_new(resp, "id", json_string(ph));
        }
        if (json_object_get(resp, "created")) {
            snprintf(ph, sizeof ph, "%s-%d", r->srv->hole_nonce, HOLE_CREATED);
            json_object_set_new(resp, "created", json_string(ph));
        }
    }
    char *text = squad_json_text(resp, len, &err); /* reals in their shortest form */
    json_decref(resp);
    return text;
}

static void finish_dapi(srv_req *r) {
    size_t len = 0;
    char *text = dapi_text(r, 0, &len);
    if (!text) {
        fail_req(r, 500, NULL, "could not render the response");
        return;
    }
    if (r->srv->memo) {
        size_t mlen = 0;
        char *m = dapi_text(r, 1, &mlen);
        if (m) memo_store(r, m, mlen);
        free(m);
    }
    answer(r, 200, text, len, CT_JSON);
}

void srv_req_finish(srv_req *r) {
    srv_job *j = &r->job;
    /* however the job ended (even a timeout, or an answer), a client already gone is counted so */
    if (client_gone(r)) r->client_left = 1;
    switch (j->status) {
    case SRV_JOB_OK: break;
    case SRV_JOB_TIMEOUT:
        fail_req(r, 503, NULL, "the request took longer than --timeout (%g s) waiting and running", r->srv->opts.timeout_s);
        return;
    case SRV_JOB_CANCELLED:
        r->client_left = 1;
        fail_req(r, 503, NULL, "the request was cancelled: its client disconnected");
        return;
    case SRV_JOB_SHUTDOWN: fail_req(r, 503, NULL, "the server is shutting down"); return;
    case SRV_JOB_FAILED:
    default: fail_req(r, 500, NULL, "the engine failed: %s", r->errs[0].msg); return;
    }
    if (j->kind == SRV_JOB_CLEAR) {
        answer_status(r, 200, "cleared");
        return;
    }
    if (r->ep != SRV_EP_SCORE)
        for (int i = 0; i < j->n_rows; i++)
            if (r->errs[i].code) {
                fail_req(r, r->errs[i].code == SQUAD_E_INVALID ? (r->ep == SRV_EP_ASK ? 422 : 400) : 500, NULL, "%s",
                         r->errs[i].msg);
                return;
            }
    if (r->ep == SRV_EP_ASK) finish_ask(r);
    else if (r->ep == SRV_EP_SCORE) finish_score(r);
    else finish_dapi(r);
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
        if (!ran) /* answered without the engine (the request memo, stats, an error) */
            srv_log(srv, "%s %d %.2f ms%s", SRV_EP_PATH[r->ep], r->status, dt * 1000.0, r->memo_hit ? " memo" : "");
        else
            srv_log(srv, "%s %d %.2f ms (before the engine %.2f ms, engine %.2f ms: %d steps ran its rows, %d ran"
                    " others' only, the longest %.2f ms; %" PRIu64 " tokens computed, %" PRIu64 " reused)",
                    SRV_EP_PATH[r->ep], r->status, dt * 1000.0, before_ms, engine_ms, r->job.steps_ran,
                    r->job.steps_waited, r->job.longest_step_s * 1000.0, computed, reused);
    }
    squad_buf_free(&r->body);
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

/* ---------------------------------------------------------------------------------------------
 * In process
 * ------------------------------------------------------------------------------------------- */

/* The mark is set under the waiter's lock, which the waiter holds while it tests the mark: it cannot
   see the request done, return and free it (with the lock and condition on its stack) before this
   unlocks. The lock and condition are read into locals first; after the unlock nothing is touched. */
static void wake_cond(srv_req *r) {
    pthread_mutex_t *lock = r->wait_lock;
    pthread_cond_t *cond = r->wait_cond;
    pthread_mutex_lock(lock);
    atomic_store_explicit(&r->job_done, 1, memory_order_release);
    pthread_cond_signal(cond);
    pthread_mutex_unlock(lock);
}

int squad_server_handle(squad_server *srv, const char *method, const char *path, const char *const *headers,
                        int n_headers, const char *body, size_t len, int *status, char **resp_body, size_t *resp_len,
                        const char **content_type) {
    *status = 0;
    *resp_body = NULL;
    *resp_len = 0;
    *content_type = CT_JSON;
    srv_req *r = srv_req_new(srv);
    if (!r) return SQUAD_E_NOMEM;
    const char *auth = NULL;
    for (int i = 0; i < n_headers; i++)
        if (headers[2 * i] && !strcasecmp(headers[2 * i], "Authorization")) auth = headers[2 * i + 1];
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    r->wait_lock = &lock;
    r->wait_cond = &cond;
    r->wake = wake_cond;
    if (!srv_req_route(r, method ? method : "", path ? path : "", auth, (long long)len)) {
        srv_req_body(r, body, len);
        if (!srv_req_prepare(r)) {
            pthread_mutex_lock(&lock);
            if (!srv_req_submit(r)) {
                while (!atomic_load_explicit(&r->job_done, memory_order_acquire)) pthread_cond_wait(&cond, &lock);
                pthread_mutex_unlock(&lock);
                srv_req_finish(r);
            } else {
                pthread_mutex_unlock(&lock);
            }
        }
    }
    *status = r->status;
    *resp_body = r->resp;
    *resp_len = r->resp_len;
    *content_type = r->ctype ? r->ctype : CT_JSON;
    r->resp = NULL;
    srv_req_end(r, 1);
    pthread_cond_destroy(&cond);
    pthread_mutex_destroy(&lock);
    return 0;
}
