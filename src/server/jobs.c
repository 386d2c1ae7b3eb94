/*
 * jobs.c — the server's request queue: a bounded FIFO of jobs and the scheduler thread that feeds
 * them to the engine (see jobs.h). This is the one file of the server that calls the engine:
 * creating it, feeding rows in (squad_engine_submit), stepping it, its statistics and clearing it.
 *
 * The scheduler thread alone touches the engine and the list of jobs in it; the queue is shared with
 * the connection threads (submit) and the sweeper (late waiting jobs) under the lock.
 */
#define _POSIX_C_SOURCE 200809L
#include "server/jobs.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

/* How often the sweeper answers waiting jobs whose deadline passed or whose client left. */
#define SRV_SWEEP_MS 50

const double SRV_STEP_ROWS_BOUNDS[SRV_STEP_BUCKETS] = {1, 2, 3, 4, 6, 8, 12, 16, 32, 64};
const double SRV_STEP_TOKENS_BOUNDS[SRV_STEP_BUCKETS] = {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
const double SRV_STEP_SECONDS_BOUNDS[SRV_STEP_BUCKETS] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1};

/* One row of a job in the engine: its options (with the cancel check), where its end goes, and the
 * tokens it had computed after the last step (a step's figures are what its rows' counts grew by). */
typedef struct srv_row_run {
    squad_score_opts opts;
    srv_job *job;
    int i;
    int computed_seen;
    int ended; /* its end was recorded (a row ends once, however the engine reports it) */
} srv_row_run;

struct srv_jobs {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* a job arrived, or stop */
    pthread_t thread;
    int thread_started;
    pthread_t sweeper; /* answers late waiting jobs while the engine is inside a step */
    pthread_cond_t sweeper_wake;
    int sweeper_started, sweeper_stop;

    squad_model *model;
    squad_engine_opts opts;
    squad_engine *engine;
    int ready; /* 0 loading, 1 ready, -1 failed */
    squad_err engine_err;

    srv_job *head, *tail; /* the queue, oldest first */
    int queued, capacity;
    int stopping;
    double stop_deadline;

    /* the scheduler thread's own */
    srv_job *running, *running_tail; /* jobs with rows in the engine, in the order they went in */
    int in_flight;                   /* rows submitted and not yet done */
    int max_rows, batch_tokens;      /* the engine's */
    int room;                        /* max_rows + SRV_LOOKAHEAD_ROWS */

    srv_jobs_stats stats; /* counters and the engine figures, published under lock */
    void (*log)(void *ctx, const char *line);
    srv_jobs_on_ready on_ready;
    void (*on_stop)(void *ctx, squad_engine *engine);
    void *log_ctx; /* the owner's context for log and on_ready */
};

static void jobs_log(srv_jobs *s, const char *fmt, ...) SQUAD_PRINTF(2, 3);
static void jobs_log(srv_jobs *s, const char *fmt, ...) {
    if (!s->log) return;
    char line[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->log(s->log_ctx, line);
}

/* Ends a job: its figures, then its callback (the scheduler's last touch of the job). */
static void complete(srv_jobs *s, srv_job *job, srv_job_status status) {
    job->status = status;
    job->t_end = squad_now_seconds();
    free(job->run);
    job->run = NULL;
    pthread_mutex_lock(&s->lock);
    s->stats.jobs_done++;
    if (status == SRV_JOB_TIMEOUT) s->stats.jobs_timeout++;
    if (status == SRV_JOB_CANCELLED) s->stats.jobs_cancelled++;
    if (status == SRV_JOB_FAILED) s->stats.jobs_failed++;
    pthread_mutex_unlock(&s->lock);
    job->done(job);
}

/* Answers the waiting jobs whose deadline has passed or whose client left (the sweeper's work). */
static void expire_waiting(srv_jobs *s, double now) {
    srv_job *expired = NULL, **tail = &expired;
    pthread_mutex_lock(&s->lock);
    srv_job **pp = &s->head, *prev = NULL;
    while (*pp) {
        srv_job *j = *pp;
        int late = j->deadline > 0 && now > j->deadline;
        int gone = !late && j->client_gone && j->client_gone(j->client_ctx);
        if (late || gone) {
            j->cancel_seen = late ? SRV_JOB_TIMEOUT : SRV_JOB_CANCELLED;
            *pp = j->next;
            if (s->tail == j) s->tail = prev;
            s->queued--;
            j->next = NULL;
            *tail = j;
            tail = &j->next;
        } else {
            prev = j;
            pp = &j->next;
        }
    }
    s->stats.queue_depth = s->queued;
    pthread_mutex_unlock(&s->lock);
    while (expired) {
        srv_job *j = expired;
        expired = j->next;
        complete(s, j, (srv_job_status)j->cancel_seen);
    }
}

/* 1 when a shutdown's grace has run out. */
static int past_grace(srv_jobs *s, double now) {
    pthread_mutex_lock(&s->lock);
    int late = s->stopping && now > s->stop_deadline;
    pthread_mutex_unlock(&s->lock);
    return late;
}

/* Polled before every row goes in and, through the engine, before every chunk: 1 when the job must
 * stop (why in job->cancel_seen; a failed job's rows stop with it). */
static int job_should_stop(srv_jobs *s, srv_job *job) {
    if (job->cancel_seen || job->failed) return 1;
    double now = squad_now_seconds();
    if (job->deadline > 0 && now > job->deadline) job->cancel_seen = SRV_JOB_TIMEOUT;
    else if (job->client_gone && job->client_gone(job->client_ctx)) job->cancel_seen = SRV_JOB_CANCELLED;
    else if (past_grace(s, now)) job->cancel_seen = SRV_JOB_SHUTDOWN;
    return job->cancel_seen != 0;
}

/* The engine's cancel check of one row. */
static int row_cancelled(void *ctx) {
    srv_row_run *rr = ctx;
    return job_should_stop(rr->job->queue, rr->job);
}

/* Publishes the engine's figures after a step (or a clear); step_s: how long that step took (0:
 * not a step), named in the log line of the CUDA graphs it captured. */
static void publish_engine_stats(srv_jobs *s, double step_s) {
    squad_cache_stats st;
    squad_engine_cache_stats(s->engine, &st);
    uint64_t routes[SQUAD_MAX_ROUTES] = {0};
    int n_routes = s->opts.specialists ? squad_specialists_count(s->opts.specialists) : 0;
    if (n_routes > SQUAD_MAX_ROUTES) n_routes = SQUAD_MAX_ROUTES;
    for (int i = 0; i < n_routes; i++) routes[i] = squad_engine_route_rows(s->engine, i);
    squad_device_stats dev;
    squad_engine_device_stats(s->engine, &dev);
    int running = 0;
    for (const srv_job *j = s->running; j; j = j->next) running++;
    pthread_mutex_lock(&s->lock);
    uint64_t before = s->stats.cache.uncacheable;
    const int graphs_before = s->stats.device_stats.graphs;
    const double capture_before = s->stats.device_stats.capture_s;
    s->stats.cache = st;
    s->stats.device_stats = dev;
    s->stats.n_routes = n_routes;
    memcpy(s->stats.route_rows, routes, sizeof routes);
    s->stats.rows_in_flight = s->in_flight;
    /* no row left in the engine: it is idle now, not only once the loop next waits (a client
     * answered by this step must not read its rows as still running) */
    if (s->in_flight == 0) s->stats.rows_running = 0;
    s->stats.jobs_running = running;
    pthread_mutex_unlock(&s->lock);
    if (graphs_before > 0 && dev.graphs > graphs_before)
        jobs_log(s, "captured %d CUDA graph(s) for a new batch shape in %.1f ms, a step of %.1f ms (%d in all, "
                  "%.2f s capturing so far)", dev.graphs - graphs_before, (dev.capture_s - capture_before) * 1000.0,
                  step_s * 1000.0, dev.graphs, dev.capture_s);
    if (before == 0 && st.uncacheable > 0) /* once: the metric counts the rest */
        jobs_log(s, "a state did not fit the state cache's budget (%.1f MB) and was computed uncached; such rows "
                  "are counted in squad_cache_uncacheable_total (raise --cache-mb to cache them)",
                  (double)st.budget_bytes / (1 << 20));
}

/* ---- rows in and out of the engine ----------------------------------------------------------- */

/* The engine's end of one row (called from squad_engine_step, or from squad_engine_submit when its
 * row memo answers). Records how the row ended; the job is completed by reap, outside the engine. */
static void row_done(void *ctx, int rc, const squad_err *err) {
    srv_row_run *rr = ctx;
    srv_job *job = rr->job;
    srv_jobs *s = job->queue;
    if (rr->ended) return;
    rr->ended = 1;
    job->outstanding--;
    s->in_flight--;
    if (rc == 0) {
        memset(&job->errs[rr->i], 0, sizeof job->errs[rr->i]);
        job->rows_run++;
        return;
    }
    job->errs[rr->i] = *err;
    if (!job->errs[rr->i].code) job->errs[rr->i].code = rc;
    if (rc == SQUAD_E_INVALID) return; /* the row's own error; the job goes on */
    if (rc == SQUAD_E_CANCELLED || job->cancel_seen) {
        if (!job->cancel_seen) job->cancel_seen = SRV_JOB_CANCELLED;
        job->stopped = 1;
        return;
    }
    /* The engine failed on this row: the job fails (its other rows stop at their next chunk), the
       other jobs go on. */
    if (!job->failed) {
        job->failed = 1;
        job->fail_err = *err;
        jobs_log(s, "engine error: %s", err->msg);
    }
    job->stopped = 1;
}

/* Submits row i of job. A row the engine refuses (a bad row) is that row's error at once. */
static void submit_row(srv_jobs *s, srv_job *job, int i) {
    srv_row_run *rr = &job->run[i];
    job->next_row = i + 1;
    job->outstanding++;
    s->in_flight++;
    squad_err err = {0};
    int rc = squad_engine_submit(s->engine, job->rows[i], &rr->opts, &job->results[i], row_done, rr, &err);
    if (rc) row_done(rr, rc, &err); /* done is not called for a refused row */
}

/* Takes job into the engine's list: the per-row options, with the checkpoints rule of the moment. */
static int admit(srv_jobs *s, srv_job *job, int others) {
    squad_err err = {0};
    job->run = squad_calloc((size_t)(job->n_rows > 0 ? job->n_rows : 1), sizeof *job->run, &err);
    if (!job->run) return -1;
    job->queue = s;
    job->t_start = squad_now_seconds();
    for (int i = 0; i < job->n_rows; i++) {
        srv_row_run *rr = &job->run[i];
        rr->job = job;
        rr->i = i;
        rr->opts.want_vocab = job->want_vocab;
        /* A new state keeps only its end checkpoint when other requests wait or run: its first row
           still makes the checkpoint that the job's other rows restore. */
        rr->opts.end_checkpoint_only = others;
        rr->opts.checkpoints = job->checkpoints;
        rr->opts.n_checkpoints = job->n_checkpoints;
        rr->opts.cancelled = row_cancelled;
        rr->opts.cancel_ctx = rr;
        memset(&job->errs[i], 0, sizeof job->errs[i]);
    }
    if (s->running_tail) s->running_tail->next = job;
    else s->running = job;
    s->running_tail = job;
    job->next = NULL;
    return 0;
}

/* Submits the rows of the jobs in the engine, oldest job first, while there is room. */
static void fill(srv_jobs *s) {
    for (srv_job *j = s->running; j; j = j->next) {
        while (!j->stopped && j->next_row < j->n_rows) {
            if (s->in_flight >= s->room) return;
            if (job_should_stop(s, j)) {
                j->stopped = 1;
                break;
            }
            submit_row(s, j, j->next_row);
        }
    }
}

/* 1 when a job in the engine still has rows to submit (no later job may pass it). */
static int running_unsubmitted(const srv_jobs *s) {
    for (const srv_job *j = s->running; j; j = j->next)
        if (!j->stopped && j->next_row < j->n_rows) return 1;
    return 0;
}

static srv_job_status job_status(const srv_job *job) {
    if (job->failed) return SRV_JOB_FAILED;
    if (job->cancel_seen) return (srv_job_status)job->cancel_seen;
    return SRV_JOB_OK;
}

/* Completes the jobs in the engine that are over: every row done, or stopped with none left in the
 * engine (it borrows a row's arrays until its done). */
static void reap(srv_jobs *s) {
    srv_job **pp = &s->running, *prev = NULL;
    while (*pp) {
        srv_job *j = *pp;
        int over = j->outstanding == 0 && (j->stopped || j->next_row >= j->n_rows);
        if (!over) {
            prev = j;
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        if (s->running_tail == j) s->running_tail = prev;
        j->next = NULL;
        if (j->failed) j->errs[0] = j->fail_err;
        complete(s, j, job_status(j));
    }
}

/* ---- the queue into the engine ---------------------------------------------------------------- */

/* Runs a cache-clear job: only with nothing in the engine (no checkpoint is pinned by a row). */
static void run_clear(srv_jobs *s, srv_job *job) {
    job->t_start = squad_now_seconds();
    squad_engine_cache_clear(s->engine);
    publish_engine_stats(s, 0.0);
    complete(s, job, SRV_JOB_OK);
}

static void run_call(srv_jobs *s, srv_job *job) {
    job->t_start = squad_now_seconds();
    job->engine_call(job->call_ctx, s->engine);
    publish_engine_stats(s, 0.0);
    complete(s, job, SRV_JOB_OK);
}

/* Moves jobs from the head of the queue into the engine while they fit (jobs.h); after a
 * shutdown's grace, answers the waiting ones instead. */
static void take_from_queue(srv_jobs *s) {
    for (;;) {
        const double now = squad_now_seconds();
        pthread_mutex_lock(&s->lock);
        srv_job *j = s->head;
        if (!j) {
            pthread_mutex_unlock(&s->lock);
            return;
        }
        const int shutdown = s->stopping && now > s->stop_deadline;
        if (!shutdown) {
            const int engine_empty = s->in_flight == 0 && !s->running;
            if (j->kind == SRV_JOB_CLEAR ? !engine_empty
                                         : running_unsubmitted(s) || (s->in_flight > 0 && s->in_flight + j->n_rows > s->room)) {
                pthread_mutex_unlock(&s->lock);
                return;
            }
        }
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->queued--;
        s->stats.queue_depth = s->queued;
        j->next = NULL;
        const int others = s->queued > 0 || s->running != NULL;
        pthread_mutex_unlock(&s->lock);
        if (shutdown) complete(s, j, SRV_JOB_SHUTDOWN);
        else if (j->kind == SRV_JOB_CLEAR) run_clear(s, j);
        else if (j->kind == SRV_JOB_CALL) run_call(s, j);
        else if (admit(s, j, others) < 0) {
            if (j->errs && j->n_rows > 0) squad_fail(&j->errs[0], SQUAD_E_NOMEM, "out of memory for %d rows", j->n_rows);
            complete(s, j, SRV_JOB_FAILED);
        } else {
            fill(s); /* its rows go in now, before the next job is looked at */
        }
    }
}

/* Counts one step (rows run, tokens computed, its wall time) into the published figures. */
static void count_step(srv_jobs *s, int rows, uint64_t tokens, double step_s) {
    int rb = 0, tb = 0, sb = 0;
    while (rb < SRV_STEP_BUCKETS && rows > SRV_STEP_ROWS_BOUNDS[rb]) rb++;
    while (tb < SRV_STEP_BUCKETS && (double)tokens > SRV_STEP_TOKENS_BOUNDS[tb]) tb++;
    while (sb < SRV_STEP_BUCKETS && step_s > SRV_STEP_SECONDS_BOUNDS[sb]) sb++;
    pthread_mutex_lock(&s->lock);
    s->stats.steps++;
    s->stats.step_rows_bucket[rb]++;
    s->stats.step_tokens_bucket[tb]++;
    s->stats.step_rows_sum += (uint64_t)rows;
    s->stats.step_tokens_sum += tokens;
    s->stats.step_seconds_bucket[sb]++;
    s->stats.step_seconds_sum += step_s;
    s->stats.rows_running = rows;
    pthread_mutex_unlock(&s->lock);
}

/* One batched step of the engine, with its figures. A row's result counts the tokens run for it
 * (squad_result.computed, grown chunk by chunk), so the rows a step ran are those whose count grew
 * in it and its tokens the sum of the growth: read after the step from the rows submitted, before
 * reap hands any job back. */
static void step(srv_jobs *s) {
    squad_err err = {0};
    const double t0 = squad_now_seconds();
    int rc = squad_engine_step(s->engine, &err);
    const double step_s = squad_now_seconds() - t0;
    if (rc < 0) jobs_log(s, "engine step failed (its rows failed with it): %s", err.msg);
    int rows = 0;
    uint64_t tokens = 0;
    for (srv_job *j = s->running; j; j = j->next) {
        int ran = 0;
        for (int i = 0; i < j->next_row; i++) {
            srv_row_run *rr = &j->run[i];
            const int now = j->results[i].computed;
            if (now > rr->computed_seen) {
                rows++;
                ran = 1;
                tokens += (uint64_t)(now - rr->computed_seen);
            }
            rr->computed_seen = now;
        }
        if (ran) j->steps_ran++;
        else if (j->outstanding > 0) j->steps_waited++;
        if ((ran || j->outstanding > 0) && step_s > j->longest_step_s) j->longest_step_s = step_s;
    }
    count_step(s, rows, tokens, step_s);
    publish_engine_stats(s, step_s);
}

/* The engine says it holds no row while jobs wait for rows it took: a broken promise of the engine,
 * which would hang those jobs. They fail instead (the engine holds nothing of theirs any more). */
static void fail_lost_rows(srv_jobs *s) {
    for (srv_job *j = s->running; j; j = j->next) {
        if (j->outstanding == 0) continue;
        jobs_log(s, "the engine dropped %d rows of a request without ending them", j->outstanding);
        s->in_flight -= j->outstanding;
        j->outstanding = 0;
        j->stopped = 1;
        if (!j->failed) {
            j->failed = 1;
            squad_fail(&j->fail_err, SQUAD_E_BACKEND, "the engine dropped the request's rows");
        }
    }
}

/* Waits until a job arrives or the scheduler stops; 0 when it should stop (nothing left). */
static int wait_for_work(srv_jobs *s) {
    pthread_mutex_lock(&s->lock);
    while (!s->head && !s->stopping) pthread_cond_wait(&s->wake, &s->lock);
    int more = s->head != NULL;
    pthread_mutex_unlock(&s->lock);
    return more;
}

/* The engine could not be created: every job fails with why. */
static void fail_all(srv_jobs *s) {
    for (;;) {
        if (!wait_for_work(s)) return;
        pthread_mutex_lock(&s->lock);
        srv_job *j = s->head;
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->queued--;
        s->stats.queue_depth = s->queued;
        pthread_mutex_unlock(&s->lock);
        j->next = NULL;
        if (j->errs && j->n_rows > 0) j->errs[0] = s->engine_err;
        complete(s, j, SRV_JOB_FAILED);
    }
}

static void *jobs_main(void *arg) {
    srv_jobs *s = arg;
    double t0 = squad_now_seconds();
    squad_engine *e = squad_engine_new(s->model, &s->opts, &s->engine_err);
    if (e && s->on_ready && s->on_ready(s->log_ctx, e, &s->engine_err) < 0) {
        squad_engine_free(e);
        e = NULL;
    }
    if (e) {
        squad_engine_batching(e, &s->max_rows, &s->batch_tokens);
        s->room = s->max_rows + SRV_LOOKAHEAD_ROWS;
    }
    pthread_mutex_lock(&s->lock);
    s->engine = e;
    s->ready = e ? 1 : -1;
    s->stats.ready = s->ready == 1;
    s->stats.max_rows = s->max_rows;
    s->stats.batch_tokens = s->batch_tokens;
    s->stats.lookahead = SRV_LOOKAHEAD_ROWS;
    if (e) snprintf(s->stats.device, sizeof s->stats.device, "%s", squad_engine_device(e));
    pthread_mutex_unlock(&s->lock);
    if (!e) {
        jobs_log(s, "the engine could not be created: %s", s->engine_err.msg);
        fail_all(s);
        return NULL;
    }
    publish_engine_stats(s, 0.0);
    jobs_log(s, "engine ready on %s in %.1f s; state cache budget %.1f MB; batching: --max-rows %d, --batch-tokens %d "
              "(%d rows submitted at most)", squad_engine_device(e), squad_now_seconds() - t0,
              (double)s->stats.cache.budget_bytes / (1 << 20), s->max_rows, s->batch_tokens, s->room);
    for (;;) {
        take_from_queue(s);
        fill(s);
        reap(s);
        if (squad_engine_pending(e) > 0) {
            step(s);
            reap(s);
            continue;
        }
        if (s->in_flight > 0) fail_lost_rows(s);
        reap(s);
        if (s->running) continue; /* rows to submit, or jobs to end: the next round does it */
        pthread_mutex_lock(&s->lock);
        s->stats.rows_running = 0;
        s->stats.rows_in_flight = 0;
        s->stats.jobs_running = 0;
        pthread_mutex_unlock(&s->lock);
        if (!wait_for_work(s)) break;
    }
    pthread_mutex_lock(&s->lock);
    void (*on_stop)(void *, squad_engine *) = s->on_stop;
    pthread_mutex_unlock(&s->lock);
    if (on_stop) on_stop(s->log_ctx, e);
    return NULL;
}

void srv_jobs_set_on_stop(srv_jobs *s, void (*on_stop)(void *ctx, squad_engine *engine)) {
    pthread_mutex_lock(&s->lock);
    s->on_stop = on_stop;
    pthread_mutex_unlock(&s->lock);
}

/* The sweeper: the scheduler thread cannot look at the queue while the engine runs a step (a long
 * chunk on a CPU takes seconds), so this thread does, every SRV_SWEEP_MS. */
static void *sweeper_main(void *arg) {
    srv_jobs *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->sweeper_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SRV_SWEEP_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->sweeper_wake, &s->lock, &ts);
        if (s->sweeper_stop) break;
        pthread_mutex_unlock(&s->lock);
        expire_waiting(s, squad_now_seconds());
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

srv_jobs *srv_jobs_start(squad_model *model, const squad_engine_opts *opts, int capacity,
                           void (*log)(void *ctx, const char *line), srv_jobs_on_ready on_ready, void *log_ctx,
                           squad_err *err) {
    srv_jobs *s = squad_calloc(1, sizeof *s, err);
    if (!s) return NULL;
    s->model = model;
    s->opts = *opts;
    s->capacity = capacity;
    s->stats.queue_capacity = capacity;
    s->log = log;
    s->log_ctx = log_ctx;
    s->on_ready = on_ready;
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        free(s);
        squad_fail(err, SQUAD_E_NOMEM, "cannot create the scheduler's lock");
        return NULL;
    }
    if (pthread_cond_init(&s->wake, NULL) != 0) {
        pthread_mutex_destroy(&s->lock);
        free(s);
        squad_fail(err, SQUAD_E_NOMEM, "cannot create the scheduler's condition variable");
        return NULL;
    }
    if (pthread_cond_init(&s->sweeper_wake, NULL) != 0) {
        pthread_cond_destroy(&s->wake);
        pthread_mutex_destroy(&s->lock);
        free(s);
        squad_fail(err, SQUAD_E_NOMEM, "cannot create the scheduler's condition variable");
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, jobs_main, s) != 0) {
        srv_jobs_stop(s, 0);
        squad_fail(err, SQUAD_E_NOMEM, "cannot start the scheduler thread");
        return NULL;
    }
    s->thread_started = 1;
    if (pthread_create(&s->sweeper, NULL, sweeper_main, s) != 0) {
        srv_jobs_stop(s, 0);
        squad_fail(err, SQUAD_E_NOMEM, "cannot start the scheduler's sweeper thread");
        return NULL;
    }
    s->sweeper_started = 1;
    return s;
}

int srv_jobs_submit(srv_jobs *s, srv_job *job) {
    job->next = NULL;
    job->cancel_seen = 0;
    job->status = SRV_JOB_OK;
    job->rows_run = 0;
    job->queue = s;
    job->run = NULL;
    job->next_row = job->outstanding = job->stopped = job->failed = 0;
    memset(&job->fail_err, 0, sizeof job->fail_err);
    pthread_mutex_lock(&s->lock);
    if (s->stopping || s->queued >= s->capacity) {
        pthread_mutex_unlock(&s->lock);
        return -1;
    }
    if (s->tail) s->tail->next = job;
    else s->head = job;
    s->tail = job;
    s->queued++;
    s->stats.queue_depth = s->queued;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int srv_jobs_ready(srv_jobs *s, squad_err *err) {
    pthread_mutex_lock(&s->lock);
    int r = s->ready;
    if (r < 0 && err) *err = s->engine_err;
    pthread_mutex_unlock(&s->lock);
    return r;
}

void srv_jobs_get_stats(srv_jobs *s, srv_jobs_stats *out) {
    pthread_mutex_lock(&s->lock);
    *out = s->stats;
    pthread_mutex_unlock(&s->lock);
}

void srv_jobs_stop(srv_jobs *s, double grace_s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    s->stop_deadline = squad_now_seconds() + grace_s;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    if (s->thread_started) pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->lock);
    s->sweeper_stop = 1;
    pthread_cond_signal(&s->sweeper_wake);
    pthread_mutex_unlock(&s->lock);
    if (s->sweeper_started) pthread_join(s->sweeper, NULL);
    squad_engine_free(s->engine);
    pthread_cond_destroy(&s->sweeper_wake);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
