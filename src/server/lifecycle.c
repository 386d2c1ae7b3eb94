/*
 * lifecycle.c — the server's life (server.h): squad_server_new loads the text side (tokenizer, token
 * cache, template), the model and the specialists, and starts the request queue's scheduler thread,
 * which creates the engine and then makes the decision APIs' context (on_engine_ready);
 * squad_server_listen starts the HTTP transport; squad_server_shutdown stops accepting, lets the
 * requests in flight finish (bounded), stops the queue and then the transport; squad_server_free
 * frees it all.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server/cache_dir.h"
#include "server/http.h"
#include "server/request.h"
#include "server/token_cache.h"

/* Seconds a shutdown waits, after the engine's requests, for requests still arriving (each gets 503
 * at its next bytes); those that send nothing are closed when the daemon stops. */
#define SRV_ARRIVING_GRACE_S 1.0

static void jobs_log_cb(void *ctx, const char *line) { srv_log(ctx, "%s", line); }


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
    o->max_conns_per_ip = SQUAD_SERVE_MAX_CONNS_PER_IP;
    /* The host tier sized from the machine unless --cache-host-mb says (docs/design.md section 7,
     * "Tiers"); CUDA only, pinned before /ready. */
    o->engine.cache.host_budget_bytes = SQUAD_CACHE_HOST_AUTO;
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

/* The default budget for request bodies being received: a fraction of the machine's RAM. */
static size_t default_body_budget(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return (size_t)1 << 30;
    return (size_t)pages / SQUAD_SERVE_INFLIGHT_BODY_RAM_FRACTION * (size_t)page;
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
    srv->max_tokens_limit = why == SQUAD_LIMIT_OPTION   ? "--max-tokens"
                            : why == SQUAD_LIMIT_MEMORY ? "what the device's memory holds"
                                                        : "the model's positions";
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
    squad_cache_stats cs;
    squad_engine_cache_stats(engine, &cs);
    const int host_auto = srv->opts.engine.cache.host_budget_bytes == SQUAD_CACHE_HOST_AUTO;
    if (cs.host_budget_bytes > 0)
        srv_log(srv, "host tier: %.0f MB of pinned host memory under the state cache, pinned in %.2f s (%s)",
                (double)cs.host_budget_bytes / (1 << 20), cs.host_reserve_seconds,
                host_auto ? "sized from the machine (docs/design.md section 7); --cache-host-mb sets it"
                          : "--cache-host-mb");
    else if (cs.budget_bytes > 0 && !strcmp(squad_engine_device(engine), "cpu"))
        srv_log(srv, "host tier: off (the CPU backend's checkpoints are host memory already; --cache-dir is its "
                "second tier)");
    else if (cs.budget_bytes > 0 && host_auto)
        srv_log(srv, "host tier: off (the size from the machine was too small to keep or could not be pinned; "
                "--cache-host-mb N asks for N MB)");
    else if (cs.budget_bytes > 0)
        srv_log(srv, "host tier: off (--cache-host-mb N puts N MB of pinned host memory under the state cache)");
    if (srv->cache_dir) srv_cache_dir_start(srv->cache_dir, engine); /* /ready does not wait for it */
    srv->dapi = squad_dapi_ctx_new(srv->tok, srv->served_name, n_names ? names : NULL, n_names, srv->max_tokens, err);
    if (!srv->dapi) return err->code ? err->code : SQUAD_E_NOMEM;
    for (int a = 0; a < SQUAD_DAPI_COUNT; a++) {
        const char *off = squad_dapi_disabled(srv->dapi, (squad_dapi)a);
        if (off) srv_log(srv, "%s is disabled for this tokenizer: %s", a == SQUAD_DAPI_DECISIONS ? "/v1/decisions" : "/v1/systemone", off);
    }
    return 0;
}

/* On the scheduler thread after the drain, before the engine is freed: the disk tier's save. */
static void on_engine_stop(void *ctx, squad_engine *engine) {
    squad_server *srv = ctx;
    if (srv->cache_dir) srv_cache_dir_save(srv->cache_dir, engine);
}

/* --cache-dir: the tokenizer file joins the cache file's identity. */
static int make_cache_dir(squad_server *srv, const squad_server_opts *opts, squad_err *err) {
    char *tok = opts->tokenizer_path ? NULL : squad_path_join(opts->model_dir, "tokenizer.json", err);
    if (!opts->tokenizer_path && !tok) return err->code;
    srv->cache_dir = srv_cache_dir_new(srv, opts->cache_dir, opts->tokenizer_path ? opts->tokenizer_path : tok, err);
    free(tok);
    return srv->cache_dir ? 0 : err->code;
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
    srv->body_budget = opts->max_inflight_body ? opts->max_inflight_body : default_body_budget();
    srv_log(srv, "request bodies being received: at most %zu MiB together (--max-inflight-body-mb), each at most %zu "
            "bytes (--max-body)", srv->body_budget >> 20, srv->opts.max_body);
    srv->opts.host = NULL; /* borrowed strings are not kept past this call */
    srv->opts.specialists_dir = NULL;
    srv->opts.tokenizer_path = srv->opts.template_path = NULL;
    srv->opts.cache_dir = NULL;
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
    if (opts->cache_dir && make_cache_dir(srv, opts, err)) goto fail;
    srv->jobs = srv_jobs_start(srv->model, &srv->opts.engine, opts->queue > 0 ? opts->queue : 1, jobs_log_cb,
                                 on_engine_ready, srv, err);
    if (!srv->jobs) goto fail;
    srv_jobs_set_on_stop(srv->jobs, on_engine_stop);
    if (srv->cache_dir) srv_cache_dir_attach(srv->cache_dir, srv->jobs);
    return srv;
fail:
    squad_server_free(srv);
    return NULL;
}

int squad_server_listen(squad_server *srv, squad_err *err) {
    return srv_http_start(srv, err);
}

int squad_server_port(const squad_server *srv) { return srv->port; }

int squad_server_ready(squad_server *srv) { return srv_jobs_ready(srv->jobs, NULL); }

void squad_server_shutdown(squad_server *srv, double grace_s) {
    if (!srv || srv->shut_down) return;
    srv->shut_down = 1;
    atomic_store(&srv->stopping, 1);
    if (srv->daemon) srv_http_quiesce(srv);
    /* Requests in the engine finish while the scheduler still runs (bounded by grace_s); requests
       still arriving are not waited for: their next bytes get 503 (http.c), and the daemon's stop
       closes those that send nothing more ... */
    double until = squad_now_seconds() + grace_s;
    while (atomic_load(&srv->in_engine) > 0 && squad_now_seconds() < until) usleep(2000);
    srv_cache_dir_stop_reader(srv->cache_dir); /* before the queue its adoption job goes to stops */
    /* ... then the scheduler answers what is left (503) and stops; the daemon sends those answers. */
    srv_jobs_stop(srv->jobs, 0);
    srv->jobs = NULL;
    until = squad_now_seconds() + 2.0;
    while (srv->daemon && atomic_load(&srv->in_engine) > 0 && squad_now_seconds() < until) usleep(2000);
    /* Requests still arriving get a moment to send their next bytes and be answered 503, not more. */
    until = squad_now_seconds() + SRV_ARRIVING_GRACE_S;
    while (srv->daemon && atomic_load(&srv->metrics.in_flight) > 0 && squad_now_seconds() < until) usleep(2000);
    if (srv->daemon) srv_http_stop(srv);
}

void squad_server_free(squad_server *srv) {
    if (!srv) return;
    squad_server_shutdown(srv, 0);
    srv_cache_dir_free(srv->cache_dir); /* after the queue: a save ran in its stop */
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
