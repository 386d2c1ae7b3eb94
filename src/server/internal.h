/*
 * internal.h — what the server's request core (server.c) and its HTTP glue (http.c) share: the
 * server object and the life of one request.
 *
 * A request goes through: srv_req_route (method, path, key, declared length: may answer at once),
 * srv_req_body (the body, bounded by --max-body), srv_req_prepare (memo, parse, validate,
 * tokenise: answers, or readies a job), srv_req_submit (hands the job to the scheduler; a full
 * queue answers 503), then, when the job's wake callback has fired, srv_req_finish (renders the
 * answer), and at last srv_req_end (metrics, log line, free). The caller that owns the transport
 * (an MHD connection, or squad_server_handle's in-process wait) supplies wake.
 *
 * wake is called from the scheduler thread when the job is over. It sets job_done itself, atomically
 * with respect to the waiter (under the waiter's lock, or while the connection is still suspended),
 * and touches nothing of the request after the waiter can see the mark: the waiter may free it then.
 */
#ifndef SQUAD_SERVER_INTERNAL_H
#define SQUAD_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "answer_json.h"
#include "decisions.h"
#include "rows.h"
#include "lru_map.h"
#include "server/metrics.h"
#include "server/sched.h"
#include "server/server.h"
#include "template.h"
#include "tokenizer.h"
#include "util.h"

struct MHD_Daemon;

struct squad_server {
    squad_server_opts opts;
    char *served_name;
    char **api_keys;
    char *model_dir;
    char *listen_host; /* NULL: 127.0.0.1 */
    squad_tokenizer *tok;
    squad_template *tpl;
    squad_dapi_ctx *dapi;
    squad_model *model;
    squad_specialists *sp; /* NULL: the model alone */
    int max_tokens;
    srv_sched *sched;
    squad_lru_map *memo;   /* the request memo (locked) */
    squad_lru_map *tokens; /* the token cache (locked) */
    srv_metrics metrics;
    char hole_nonce[40]; /* marks the places a memo entry regenerates (random per start) */
    _Atomic uint64_t next_id;
    double t_start;
    long created_unix;
    char release_date[16];
    _Atomic int stopping;
    int shut_down;
    struct MHD_Daemon *daemon;
    int port;
};

typedef enum { SRV_REQ_NEW, SRV_REQ_PENDING, SRV_REQ_ANSWERED } srv_req_state;

typedef struct srv_req srv_req;
struct srv_req {
    squad_server *srv;
    srv_endpoint ep;
    srv_req_state state;
    double t0;
    int is_post;
    /* the body */
    squad_buf body; /* the body as it arrives, bounded by --max-body */
    int too_big;
    /* the answer */
    int status;
    char *resp;
    size_t resp_len;
    const char *ctype;
    int retry_after; /* seconds; 0: no header */
    const char *allow; /* for 405 */
    int memo_hit;
    int client_left; /* its client had disconnected when the job ended (srv_req_finish) */
    int sent; /* the answer was handed to the transport */
    /* the work */
    srv_job job;
    _Atomic int job_done;
    const squad_row **row_ptrs;
    squad_result *results;
    squad_err *errs;
    squad_text_rows ask;
    squad_row_buf *score_rows; /* [n_score] */
    squad_err *score_errs;     /* [n_score]: a row's own validation error (code 0: valid) */
    int n_score;
    squad_dapi_req *dreq;
    uint64_t memo_hash;
    uint32_t memo_tag; /* the first piece of its memo key: the endpoint */
    int memo_ok; /* the answer may be stored in the memo */
    /* the transport */
    void (*wake)(srv_req *r); /* sets job_done and wakes the waiter (see the top) */
    void *conn;    /* the MHD connection */
    int client_fd; /* the socket to peek at for a disconnect; -1: none */
    pthread_mutex_t *wait_lock;
    pthread_cond_t *wait_cond;
};

srv_req *srv_req_new(squad_server *srv);
/* 1 when the request is answered already (r->status etc. set), 0 to go on. content_length < 0: not
 * given. */
int srv_req_route(srv_req *r, const char *method, const char *path, const char *authorization,
                  long long content_length);
void srv_req_body(srv_req *r, const char *data, size_t n);
/* 1 answered; 0 a job is ready to submit. */
int srv_req_prepare(srv_req *r);
/* 0 submitted (wake will be called); 1 answered at once (queue full, stopping). */
int srv_req_submit(srv_req *r);
/* Renders the answer of a finished job. */
void srv_req_finish(srv_req *r);
/* Metrics, the log line, and frees r. A request whose client had gone (its socket at end-of-file
 * when the job ended, or delivered 0: the transport could not hand the answer over) is counted as
 * SRV_STATUS_CLIENT_CLOSED whatever answer was ready: whether the answer to a departed client
 * still fits into the socket's buffer must not change what /metrics says. */
#define SRV_STATUS_CLIENT_CLOSED 499 /* nginx's "client closed request" */
void srv_req_end(srv_req *r, int delivered);

void srv_log(squad_server *srv, const char *fmt, ...) SQUAD_PRINTF(2, 3);

/* http.c */
int srv_http_start(squad_server *srv, squad_err *err);
void srv_http_quiesce(squad_server *srv);
void srv_http_stop(squad_server *srv);

#endif /* SQUAD_SERVER_INTERNAL_H */
