/*
 * request.h — what every file of the server shares: the server object and one request (its body,
 * its answer, its work for the engine, its transport), with the functions that make, answer and
 * end a request (request.c).
 *
 * A request's life is router.h's; an endpoint (endpoints.h) fills r->job and renders the answer
 * with srv_answer / srv_fail; a transport (http.c, inproc.c) supplies wake and sends r->resp.
 *
 * wake is called from the scheduler thread when the job is over. It sets job_done itself, atomically
 * with respect to the waiter (under the waiter's lock, or while the connection is still suspended),
 * and touches nothing of the request after the waiter can see the mark: the waiter may free it then.
 */
#ifndef SQUAD_SERVER_REQUEST_H
#define SQUAD_SERVER_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "decisions.h"
#include "lru_map.h"
#include "rows.h"
#include "server/images.h"
#include "server/jobs.h"
#include "server/metrics.h"
#include "server/server.h"
#include "template.h"
#include "tokenizer.h"
#include "util.h"

struct MHD_Daemon;
struct srv_conns;
struct srv_conn;

/* The session key (docs/scale.md): it names an agent's session, for a balancer to hash and for the
 * log; no answer depends on it. The header comes first, then the body's fields in this order. */
#define SRV_HEADER_SESSION "X-Squad-Session"
#define SRV_SESSION_FIELDS {"session", "prompt_cache_key", "user"}
/* The characters of a session key the log line keeps. */
#define SRV_SESSION_LOG_MAX 64
/* On every answer: the replica that answered, as host:port (the address the client reached). */
#define SRV_HEADER_REPLICA "X-Squad-Replica"

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
    const char *max_tokens_limit; /* which limit max_tokens is, for messages ("--max-tokens", ...) */
    srv_jobs *jobs; /* the request queue and its scheduler thread */
    struct srv_cache_dir *cache_dir; /* --cache-dir (cache_dir.h); NULL: none */
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
    struct srv_conns *conns;           /* the connection deadlines (conn_guard.h) */
    int max_conns;                     /* the daemon's connection limit */
    size_t body_budget;                /* --max-inflight-body-mb */
    _Atomic size_t body_reserved;      /* bytes the requests being received hold of it */
    _Atomic int in_engine;             /* requests handed to the request queue, not yet ended */
    _Atomic long mhd_log_second;       /* the second libmicrohttpd's last message was logged in */
    _Atomic int mhd_log_lines;         /* its messages in that second (http.c logs a few) */
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
    int too_big;    /* 1 over --max-body, 2 out of memory, 3 over --max-inflight-body-mb */
    size_t body_held; /* bytes this request holds of the server's body budget */
    int close_after;  /* the answer closes the connection (a malformed request) */
    int submitted;    /* counted in in_engine */
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
    char session_header[SRV_SESSION_LOG_MAX + 1]; /* X-Squad-Session, cut for the log ("": none) */
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
    srv_images images; /* the loader's state for the request's images (ask.images, dreq's) */
    uint64_t memo_hash;
    uint32_t memo_tag; /* the first piece of its memo key: the endpoint */
    int memo_ok; /* the answer may be stored in the memo */
    /* the transport */
    void (*wake)(srv_job *job); /* the job's done (job->owner: this request): sets job_done and
                                 * wakes the waiter (see the top) */
    void *conn;    /* the MHD connection */
    struct srv_conn *guard; /* its entry in the connection guard (http.c) */
    int client_fd; /* the socket to peek at for a disconnect; -1: none */
    pthread_mutex_t *wait_lock;
    pthread_cond_t *wait_cond;
};

/* The content types of the answers. */
#define SRV_CT_JSON "application/json"
#define SRV_CT_PROM "text/plain; version=0.0.4; charset=utf-8"
/* Retry-After (seconds) for a full queue and for a request that ran out of time. */
#define SRV_RETRY_AFTER_S 1
/* The status a request whose client had gone is counted as (srv_req_end): nginx's "client closed
 * request". */
#define SRV_STATUS_CLIENT_CLOSED 499

/* A line to opts.log (nothing when it is NULL). */
void srv_log(squad_server *srv, const char *fmt, ...) SQUAD_PRINTF(2, 3);

/* A new request (counted in flight until srv_req_end); NULL when out of memory. */
srv_req *srv_req_new(squad_server *srv);
/* Keeps the X-Squad-Session header's value (NULL: none) for the log line. */
void srv_req_set_session_header(srv_req *r, const char *value);
/* Appends body bytes, bounded by --max-body (over it: too_big = 1; out of memory: 2) and by the
 * server's budget for bodies being received (over it: too_big = 3). */
void srv_req_body(srv_req *r, const char *data, size_t n);
/* Takes n more bytes of the server's body budget for r: 0, or -1 when the budget has no room. */
int srv_req_hold_body(srv_req *r, size_t n);
/* The body as text ("" before any byte came); r->body.n bytes. */
static inline const char *srv_req_body_text(const srv_req *r) { return r->body.s ? r->body.s : ""; }
/* Arrays for n rows of work (row_ptrs, results, errs): 0, or -1 after answering 500. */
int srv_req_alloc_work(srv_req *r, int n);

/* The answer: status, body (taken: freed with the request), content type. */
void srv_answer(srv_req *r, int status, char *body, size_t len, const char *ctype);
/* The same from a buffer (emptied); a buffer that ran out of memory answers 500. */
void srv_answer_buf(srv_req *r, int status, squad_buf *b, const char *ctype);
/* {"status": text}. */
void srv_answer_status(srv_req *r, int status, const char *text);
/* An error in the endpoint's format: {"error": {"message", "type", "param", "code"}} on the decision
 * endpoints, {"error": {"message", "type"}} on squad's own and the rest; a 503 adds Retry-After. */
void srv_fail(srv_req *r, int status, const char *param, const char *fmt, ...) SQUAD_PRINTF(4, 5);
/* A decision API's parse error as it is. */
void srv_fail_dapi(srv_req *r, const squad_dapi_error *de);

/* Metrics, the log line, and frees r. A request whose client had gone (its socket at end-of-file
 * when the job ended, or delivered 0: the transport could not hand the answer over) is counted as
 * SRV_STATUS_CLIENT_CLOSED whatever answer was ready: whether the answer to a departed client
 * still fits into the socket's buffer must not change what /metrics says. */
void srv_req_end(srv_req *r, int delivered);

#endif /* SQUAD_SERVER_REQUEST_H */
