/*
 * sched.h — the server's scheduler: one thread owns the engine and runs jobs, first come first
 * served, from a bounded queue (docs/server.md).
 *
 * A job is one request's rows plus how to answer it (a completion callback). Connection threads
 * build jobs (parse, validate, tokenise) and submit them; a full queue refuses at once (the caller
 * answers 503 with Retry-After). The scheduler thread creates the engine (so the model's load, the
 * CUDA graphs' capture and the GEMM plans' tuning happen before /ready says yes), then loops:
 * take the next job, run its rows together, complete it. A request's rows run back to back because
 * they share a state: the first computes and checkpoints it, the others restore it, even while other
 * requests wait; what a job gives up when others wait is the extra checkpoints of a new state
 * (end_checkpoint_only).
 *
 * Cancellation: the engine polls a job's cancel check between chunks. It says stop when the job's
 * deadline (--timeout, covering the wait and the run) has passed or its client has gone (the job's
 * client_gone callback: the server peeks at the suspended connection's socket). A sweeper thread
 * answers waiting jobs whose deadline passed or whose client left every few tens of milliseconds,
 * so nothing waits silently behind a long chunk.
 *
 * The shape is ready for batching: the thread pulls work through sched_next_work and the engine is
 * called in exactly one place (run_row), so a batching scheduler can take the next chunks of several
 * jobs' rows at once by changing those two, not the job or the queue.
 */
#ifndef SQUAD_SERVER_SCHED_H
#define SQUAD_SERVER_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"

typedef enum {
    SRV_JOB_ROWS = 0, /* score rows */
    SRV_JOB_CLEAR = 1 /* drop the engine's state cache and memo */
} srv_job_kind;

typedef enum {
    SRV_JOB_OK = 0,        /* every row ran (a row may still carry its own error in errs[i]) */
    SRV_JOB_TIMEOUT = 1,   /* the deadline passed while waiting or running */
    SRV_JOB_CANCELLED = 2, /* the client went away */
    SRV_JOB_SHUTDOWN = 3,  /* the server stopped before the job could run */
    SRV_JOB_FAILED = 4     /* the engine failed (errs[0] says why) */
} srv_job_status;

typedef struct srv_job srv_job;
struct srv_job {
    /* set by the submitter */
    srv_job_kind kind;
    const squad_row *const *rows; /* [n_rows], borrowed until done is called */
    int n_rows;
    squad_result *results; /* [n_rows] */
    squad_err *errs;       /* [n_rows]: a row's own error (code 0 when it succeeded) */
    int want_vocab;
    const int *checkpoints; /* more checkpoint positions of the rows' state (cache breakpoints) */
    int n_checkpoints;
    double deadline;                /* squad_now_seconds() by which it must be answered; 0: none */
    int (*client_gone)(void *ctx);  /* 1 when the client has disconnected (may be NULL) */
    void *client_ctx;
    void (*done)(srv_job *job);     /* called once, from the scheduler thread, at the end */
    void *owner;
    /* set by the scheduler before done */
    srv_job_status status;
    int rows_run;
    double t_start, t_end; /* when it started running and ended */
    /* private */
    srv_job *next;
    int cancel_seen;
};

typedef struct srv_sched srv_sched;

typedef struct srv_sched_stats {
    int ready;           /* the engine exists */
    int queue_depth;     /* jobs waiting */
    int queue_capacity;
    int rows_running;    /* rows in the engine now (0 or 1 today) */
    uint64_t jobs_done, jobs_timeout, jobs_cancelled;
    squad_cache_stats cache; /* the engine's figures after its last row */
    int n_routes;            /* with specialists: routes (the trunk included); 0 without */
    uint64_t route_rows[SQUAD_MAX_ROUTES]; /* rows the engine answered per route */
    char device[16];
} srv_sched_stats;

/* What the scheduler's owner learns from the engine once it exists (on the scheduler thread, before
 * the scheduler says it is ready, so whatever it sets is seen by anyone who has seen ready == 1):
 * 0, or a negative code with *err, and the scheduler counts as failed. */
typedef int (*srv_sched_on_ready)(void *ctx, squad_engine *engine, squad_err *err);

/* Starts the scheduler thread; it creates the engine from model and opts (the model must outlive
 * the scheduler), then calls on_ready (may be NULL). log(ctx, line) receives its log lines (may be
 * NULL); ctx is passed to both. */
srv_sched *srv_sched_start(squad_model *model, const squad_engine_opts *opts, int queue_capacity,
                           void (*log)(void *ctx, const char *line), srv_sched_on_ready on_ready, void *ctx,
                           squad_err *err);

/* Queues a job: 0, or -1 when the queue is full or the scheduler is stopping (the job is not taken;
 * done is not called). */
int srv_sched_submit(srv_sched *s, srv_job *job);

/* 1 once the engine exists; -1 when creating it failed (why in *err). */
int srv_sched_ready(srv_sched *s, squad_err *err);
void srv_sched_get_stats(srv_sched *s, srv_sched_stats *out);

/* Stops: refuses new jobs, runs those queued until grace_s passes, answers the rest with
 * SRV_JOB_SHUTDOWN, joins the thread and frees the engine. */
void srv_sched_stop(srv_sched *s, double grace_s);

#endif /* SQUAD_SERVER_SCHED_H */
