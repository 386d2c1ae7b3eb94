/*
 * server.h — `squad serve`: squad's HTTP service (docs/server.md), as a library object.
 *
 * squad_server_new loads the tokenizer, the template, the decision APIs' context and the model and
 * starts the scheduler thread (which creates the engine); squad_server_listen starts the HTTP
 * daemon (libmicrohttpd, its own thread pool); squad_server_shutdown stops accepting, finishes what
 * is in flight (bounded) and stops. squad_server_handle answers one request in process, without
 * sockets, through the same code the HTTP daemon uses: for tests and fuzzing.
 *
 * The library never prints: log lines go to opts.log.
 */
#ifndef SQUAD_SERVER_H
#define SQUAD_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"

/* Defaults of `squad serve` (README / docs/server.md list them). */
#define SQUAD_SERVE_PORT 8080
#define SQUAD_SERVE_MEMO_MB 64
#define SQUAD_SERVE_QUEUE 256
#define SQUAD_SERVE_MAX_BODY (8u << 20)
#define SQUAD_SERVE_MAX_QUESTIONS 64
#define SQUAD_SERVE_TIMEOUT_S 30.0
#define SQUAD_SERVE_TOKEN_CACHE_MB 64
#define SQUAD_SERVE_MAX_SCORE_ROWS 1024 /* rows of one /v1/score request */
/* Connections one client address may hold open: agents behind one gateway or NAT share an address,
 * so this is generous; a balancer in front should set its own per-client limit. */
#define SQUAD_SERVE_MAX_CONNS_PER_IP 256
/* The request bodies being received, all together, default to this fraction of the machine's RAM. */
#define SQUAD_SERVE_INFLIGHT_BODY_RAM_FRACTION 16
/* Bounds of --max-rows and --batch-tokens (the engine caps them by what its backend can do). */
#define SQUAD_SERVE_MAX_ROWS (1 << 16)
#define SQUAD_SERVE_MAX_BATCH_TOKENS INT32_MAX
/* Rows the scheduler submits beyond --max-rows (server/jobs.h). */
#define SQUAD_SERVE_LOOKAHEAD_ROWS 4

typedef struct squad_server squad_server;

typedef struct squad_server_opts {
    const char *model_dir;
    const char *tokenizer_path; /* NULL: model_dir/tokenizer.json */
    const char *template_path;  /* NULL: model_dir/squad-template.json or the default */
    const char *host;           /* NULL: 127.0.0.1 */
    int port;                   /* 0: any free port (squad_server_port says which) */
    const char *served_name;    /* NULL: the model directory's name */
    const char *const *api_keys; /* [n_api_keys]; none: no auth */
    int n_api_keys;
    squad_engine_opts engine;  /* engine.specialists is set by the server from specialists_dir */
    const char *specialists_dir; /* squad-specialists.json's directory (docs/specialists.md); NULL: none */
    const char *cache_dir;    /* the disk tier: the state cache saved here at shutdown, loaded at start */
    size_t memo_bytes;        /* the request memo's budget; 0 turns it off */
    size_t token_cache_bytes; /* the token cache's budget; 0 turns it off */
    int queue;                /* jobs that may wait */
    size_t max_body;          /* bytes of a request body */
    int max_questions;        /* questions of an ask / decision request */
    double timeout_s;         /* wait + run of a request; 0: none */
    int http_threads;         /* connection threads; 0: the number of cores */
    int max_conns_per_ip;     /* open connections from one address; 0: no limit */
    size_t max_inflight_body; /* bytes of request bodies being received, all together; 0: 1/16 of RAM */
    int64_t max_image_pixels; /* the largest image (width x height) a request may carry, checked
                               * before decoding; 0: SQUAD_IMAGE_DEFAULT_MAX_PIXELS */
    int log_requests;         /* a log line per request */
    void (*log)(void *ctx, const char *line);
    void *log_ctx;
} squad_server_opts;

/* Fills opts with the defaults above (the engine's from squad_engine_opts_default, its cache
 * budget SQUAD_CACHE_BUDGET_AUTO). */
void squad_server_opts_default(squad_server_opts *opts);

squad_server *squad_server_new(const squad_server_opts *opts, squad_err *err);
/* Starts the HTTP daemon on opts.host:opts.port. */
int squad_server_listen(squad_server *srv, squad_err *err);
/* The port it listens on (after squad_server_listen). */
int squad_server_port(const squad_server *srv);
/* 1 when the engine is ready (what /ready says), 0 while loading, -1 when it failed. */
int squad_server_ready(squad_server *srv);
/* Stops accepting, lets in-flight requests finish for up to grace_s, answers the rest 503, stops the
 * daemon and the scheduler. Safe to call once; squad_server_free calls it when needed. */
void squad_server_shutdown(squad_server *srv, double grace_s);
void squad_server_free(squad_server *srv);

/* One HTTP request in process: method, path (with an optional query), headers as name / value
 * pairs (headers[2 * i], headers[2 * i + 1], n_headers pairs; names case-insensitive), body.
 * Blocks until answered (a request that needs the engine waits for the scheduler). *status gets
 * the HTTP status, *body a malloc'd NUL-terminated body (*body_len its length), *content_type a
 * static string. 0, or a negative error when out of memory. */
int squad_server_handle(squad_server *srv, const char *method, const char *path, const char *const *headers,
                        int n_headers, const char *body, size_t len, int *status, char **resp_body,
                        size_t *resp_len, const char **content_type);

#endif /* SQUAD_SERVER_H */
