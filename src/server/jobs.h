/*
 * jobs.h — the server's request queue: a bounded FIFO of jobs (one request's rows each) and the one
 * thread, the scheduler, that owns the engine and feeds its continuous batching from it
 * (docs/server.md). Not the engine's own batcher (src/scheduler.c), which this feeds.
 *
 * A job is one request's rows plus how to answer it (a completion callback). Connection threads
 * build jobs (parse, validate, tokenise) and submit them; a full queue refuses at once (the caller
 * answers 503 with Retry-After). The scheduler thread creates the engine (so the model's load, the
 * CUDA graphs' capture and the GEMM plans' tuning happen before /ready says yes), then loops: take
 * jobs from the head of the queue into the engine (squad_engine_submit, every row of a job at once
 * so that a request's questions ride in the same batches), run one batched step
 * (squad_engine_step), and complete each job whose rows are all done. Rows join and leave the
 * engine between steps; the engine's max_rows decides how many run at once, and the scheduler keeps
 * at most max_rows + SRV_LOOKAHEAD_ROWS rows submitted, so the engine always has the next rows at
 * hand while a late request still waits here, where the sweeper can answer it.
 *
 * Jobs enter the engine first come, first served: the head job goes in when all its rows fit in the
 * room left, or alone when it is larger than the whole room (its rows then go in as room frees, and
 * no later job passes it). A request's rows share a state: the engine computes a new one once and
 * the others restore it; what a job gives up when others wait or run is the extra checkpoints of a
 * new state (end_checkpoint_only).
 *
 * Cancellation: the engine polls each row's cancel check before its chunks. It says stop when the
 * job's deadline (--timeout, covering the wait and the run) has passed, its client has gone (the
 * job's client_gone callback: the server peeks at the suspended connection's socket), a shutdown's
 * grace has run out, or another row of the job failed. A stopped job's rows not yet submitted never
 * are; it is completed once the engine has let go of every row it took (their arrays are borrowed).
 * A sweeper thread answers jobs still waiting in the queue whose deadline passed or whose client
 * left every few tens of milliseconds, so nothing waits silently behind a long step.
 */
#ifndef SQUAD_SERVER_JOBS_H
#define SQUAD_SERVER_JOBS_H

#include <stddef.h>
#include <stdint.h>

#include "server/server.h"
#include "squad.h"

typedef enum {
    SRV_JOB_ROWS = 0, /* score rows */
    SRV_JOB_CLEAR = 1, /* drop the engine's state cache and memo */
    SRV_JOB_CALL = 2   /* call engine_call(call_ctx, engine) on the scheduler thread (at the head of the
                        * queue, rows in flight or not): the disk tier's adoption */
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
    void (*engine_call)(void *ctx, squad_engine *engine); /* SRV_JOB_CALL's */
    void *call_ctx;
    void *owner;
    /* set by the scheduler before done */
    srv_job_status status;
    int rows_run;
    double t_start, t_end; /* when it started running and ended */
    int steps_ran;         /* engine steps that ran some of its rows' tokens */
    int steps_waited;      /* engine steps while its rows were in the engine that ran none of them
                            * (the budget went to others, or a row waited for another's checkpoint) */
    double longest_step_s; /* the longest engine step while its rows were in the engine (a stall: a
                            * graph captured, a long chunk of another row) */
    /* private: the scheduler's */
    srv_job *next;   /* in the queue, then in the list of jobs in the engine */
    int cancel_seen; /* why it must stop (an srv_job_status), 0 while it may go on */
    struct srv_jobs *queue; /* the queue it was submitted to */
    struct srv_row_run *run; /* [n_rows] while in the engine */
    int next_row;    /* rows submitted so far */
    int outstanding; /* rows submitted and not yet done */
    int stopped;     /* no more rows go in (cancelled, failed) */
    int failed;      /* a row failed in the engine (fail_err says why) */
    squad_err fail_err;
};

typedef struct srv_jobs srv_jobs;

/* Rows the scheduler submits beyond the engine's max_rows: the next rows are in the engine when a
 * row leaves, while the queue stays where the sweeper can answer late requests. */
#define SRV_LOOKAHEAD_ROWS SQUAD_SERVE_LOOKAHEAD_ROWS

/* The histograms of a step's rows and tokens: upper bounds of the buckets, then +Inf. */
#define SRV_STEP_BUCKETS 10
extern const double SRV_STEP_ROWS_BOUNDS[SRV_STEP_BUCKETS];
extern const double SRV_STEP_TOKENS_BOUNDS[SRV_STEP_BUCKETS];
extern const double SRV_STEP_SECONDS_BOUNDS[SRV_STEP_BUCKETS];

typedef struct srv_jobs_stats {
    int ready;           /* the engine exists */
    int queue_depth;     /* jobs waiting */
    int queue_capacity;
    int rows_running;    /* rows the engine's last step ran (0 when idle) */
    int rows_in_flight;  /* rows submitted to the engine and not yet done */
    int jobs_running;    /* requests with rows in the engine (a gateway's "requests running") */
    int max_rows;        /* the engine's rows at once (--max-rows or the backend's) */
    int batch_tokens;    /* the engine's tokens in one step (--batch-tokens or the backend's) */
    int lookahead;       /* rows the scheduler submits beyond max_rows */
    uint64_t steps;      /* squad_engine_step calls that ran rows */
    /* per step: rows run and tokens computed, as histograms (bucket counts, SRV_STEP_*_BOUNDS) */
    uint64_t step_rows_bucket[SRV_STEP_BUCKETS + 1], step_tokens_bucket[SRV_STEP_BUCKETS + 1];
    uint64_t step_rows_sum, step_tokens_sum;
    /* per step: its wall time (squad_engine_step), a histogram in seconds (SRV_STEP_SECONDS_BOUNDS):
     * a stall (a graph captured, a long chunk) shows in its upper buckets */
    uint64_t step_seconds_bucket[SRV_STEP_BUCKETS + 1];
    double step_seconds_sum;
    uint64_t jobs_done, jobs_timeout, jobs_cancelled, jobs_failed;
    squad_cache_stats cache; /* the engine's figures after its last row */
    int n_routes;            /* with specialists: routes (the trunk included); 0 without */
    uint64_t route_rows[SQUAD_MAX_ROUTES]; /* rows the engine answered per route */
    char device[16];
    squad_device_stats device_stats; /* the engine's, after its last step */
} srv_jobs_stats;

/* What the scheduler's owner learns from the engine once it exists (on the scheduler thread, before
 * the scheduler says it is ready, so whatever it sets is seen by anyone who has seen ready == 1):
 * 0, or a negative code with *err, and the scheduler counts as failed. */
typedef int (*srv_jobs_on_ready)(void *ctx, squad_engine *engine, squad_err *err);

/* Starts the scheduler thread; it creates the engine from model and opts (the model must outlive
 * the scheduler), then calls on_ready (may be NULL). log(ctx, line) receives its log lines (may be
 * NULL); ctx is passed to both. */
srv_jobs *srv_jobs_start(squad_model *model, const squad_engine_opts *opts, int queue_capacity,
                           void (*log)(void *ctx, const char *line), srv_jobs_on_ready on_ready, void *ctx,
                           squad_err *err);

/* Called once on the scheduler thread after its last step, with the engine drained, before the
 * engine is freed (the disk tier saves the cache then); set before srv_jobs_stop. */
void srv_jobs_set_on_stop(srv_jobs *s, void (*on_stop)(void *ctx, squad_engine *engine));

/* Queues a job: 0, or -1 when the queue is full or the scheduler is stopping (the job is not taken;
 * done is not called). */
int srv_jobs_submit(srv_jobs *s, srv_job *job);

/* 1 once the engine exists; -1 when creating it failed (why in *err). */
int srv_jobs_ready(srv_jobs *s, squad_err *err);
void srv_jobs_get_stats(srv_jobs *s, srv_jobs_stats *out);

/* Stops: refuses new jobs, runs those queued and in the engine until grace_s passes, then stops the
 * rows in the engine at their next chunk and answers every job left with SRV_JOB_SHUTDOWN; joins
 * the thread and frees the engine. */
void srv_jobs_stop(srv_jobs *s, double grace_s);

#endif /* SQUAD_SERVER_JOBS_H */
