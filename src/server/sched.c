/*
 * sched.c — the scheduler thread and its bounded FIFO of jobs (see sched.h). This is the one file
 * that calls the engine: creating it, scoring a row (run_row), its statistics and clearing it.
 */
#define _POSIX_C_SOURCE 200809L
#include "server/sched.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

/* How often the sweeper answers waiting jobs whose deadline passed or whose client left. */
#define SRV_SWEEP_MS 50

struct srv_sched {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* a job arrived, or stop */
    pthread_t thread;
    int thread_started;
    pthread_t sweeper; /* answers late waiting jobs while the engine is inside a chunk */
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

    srv_sched_stats stats; /* counters and the engine figures, published under lock */
    void (*log)(void *ctx, const char *line);
    srv_sched_on_ready on_ready;
    void *log_ctx; /* the owner's context for log and on_ready */
};

static void sched_log(srv_sched *s, const char *fmt, ...) SQUAD_PRINTF(2, 3);
static void sched_log(srv_sched *s, const char *fmt, ...) {
    if (!s->log) return;
    char line[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->log(s->log_ctx, line);
}

/* Ends a job: its figures, then its callback (the scheduler's last touch of the job). */
static void complete(srv_sched *s, srv_job *job, srv_job_status status) {
    job->status = status;
    job->t_end = squad_now_seconds();
    pthread_mutex_lock(&s->lock);
    s->stats.jobs_done++;
    if (status == SRV_JOB_TIMEOUT) s->stats.jobs_timeout++;
    if (status == SRV_JOB_CANCELLED) s->stats.jobs_cancelled++;
    pthread_mutex_unlock(&s->lock);
    job->done(job);
}

/* Answers the waiting jobs whose deadline has passed or whose client left (the sweeper's work). */
static void expire_waiting(srv_sched *s, double now) {
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

/* Polled before every row and between chunks: 1 when the running job must stop (why in
 * job->cancel_seen). */
static int job_should_stop(srv_sched *s, srv_job *job) {
    double now = squad_now_seconds();
    if (job->deadline > 0 && now > job->deadline) job->cancel_seen = SRV_JOB_TIMEOUT;
    else if (job->client_gone && job->client_gone(job->client_ctx)) job->cancel_seen = SRV_JOB_CANCELLED;
    else if (s->stopping && now > s->stop_deadline) job->cancel_seen = SRV_JOB_SHUTDOWN;
    return job->cancel_seen != 0;
}

typedef struct cancel_ctx {
    srv_sched *s;
    srv_job *job;
} cancel_ctx;

static int engine_cancelled(void *ctx) {
    cancel_ctx *c = ctx;
    return job_should_stop(c->s, c->job);
}

static void publish_engine_stats(srv_sched *s) {
    squad_cache_stats st;
    squad_engine_cache_stats(s->engine, &st);
    uint64_t routes[SQUAD_MAX_ROUTES] = {0};
    int n_routes = s->opts.specialists ? squad_specialists_count(s->opts.specialists) : 0;
    if (n_routes > SQUAD_MAX_ROUTES) n_routes = SQUAD_MAX_ROUTES;
    for (int i = 0; i < n_routes; i++) routes[i] = squad_engine_route_rows(s->engine, i);
    pthread_mutex_lock(&s->lock);
    uint64_t before = s->stats.cache.uncacheable;
    s->stats.cache = st;
    s->stats.n_routes = n_routes;
    memcpy(s->stats.route_rows, routes, sizeof routes);
    pthread_mutex_unlock(&s->lock);
    if (before == 0 && st.uncacheable > 0) /* once: the metric counts the rest */
        sched_log(s, "a state did not fit the state cache's budget (%.1f MB) and was computed uncached; such rows "
                  "are counted in squad_cache_uncacheable_total (raise --cache-mb to cache them)",
                  (double)st.budget_bytes / (1 << 20));
}

/* The engine call: row i of job, with the options the moment asks for. */
static int run_row(srv_sched *s, srv_job *job, int i, int others_wait) {
    cancel_ctx cc = {s, job};
    squad_score_opts o;
    memset(&o, 0, sizeof o);
    o.want_vocab = job->want_vocab;
    /* A new state keeps only its end checkpoint when others wait: its first row still makes the
     * checkpoint that the job's other rows restore. */
    o.end_checkpoint_only = others_wait;
    o.checkpoints = job->checkpoints;
    o.n_checkpoints = job->n_checkpoints;
    o.cancelled = engine_cancelled;
    o.cancel_ctx = &cc;
    return squad_engine_score_ex(s->engine, job->rows[i], &o, &job->results[i], &job->errs[i]);
}

static void run_rows(srv_sched *s, srv_job *job) {
    job->t_start = squad_now_seconds();
    for (int i = 0; i < job->n_rows; i++) {
        if (job_should_stop(s, job)) {
            complete(s, job, (srv_job_status)job->cancel_seen);
            return;
        }
        pthread_mutex_lock(&s->lock);
        int others_wait = s->queued > 0;
        s->stats.rows_running = 1;
        pthread_mutex_unlock(&s->lock);
        memset(&job->errs[i], 0, sizeof job->errs[i]);
        int rc = run_row(s, job, i, others_wait);
        pthread_mutex_lock(&s->lock);
        s->stats.rows_running = 0;
        pthread_mutex_unlock(&s->lock);
        publish_engine_stats(s);
        if (rc == SQUAD_E_CANCELLED || (rc < 0 && job->cancel_seen)) {
            complete(s, job, job->cancel_seen ? (srv_job_status)job->cancel_seen : SRV_JOB_CANCELLED);
            return;
        }
        if (rc < 0 && rc != SQUAD_E_INVALID) {
            sched_log(s, "engine error: %s", job->errs[i].msg);
            job->errs[0] = job->errs[i];
            complete(s, job, SRV_JOB_FAILED);
            return;
        }
        job->rows_run = i + 1;
    }
    complete(s, job, SRV_JOB_OK);
}

static void run_job(srv_sched *s, srv_job *job) {
    if (s->ready < 0) {
        if (job->errs && job->n_rows > 0) job->errs[0] = s->engine_err;
        complete(s, job, SRV_JOB_FAILED);
        return;
    }
    if (job->kind == SRV_JOB_CLEAR) {
        job->t_start = squad_now_seconds();
        squad_engine_cache_clear(s->engine);
        publish_engine_stats(s);
        complete(s, job, SRV_JOB_OK);
        return;
    }
    run_rows(s, job);
}

/* The next job to run; NULL when stopping with nothing left. Blocks while the queue is empty. */
static srv_job *sched_next_work(srv_sched *s) {
    pthread_mutex_lock(&s->lock);
    while (!s->head && !s->stopping) pthread_cond_wait(&s->wake, &s->lock);
    srv_job *j = s->head;
    if (j) {
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->queued--;
        s->stats.queue_depth = s->queued;
        j->next = NULL;
    }
    pthread_mutex_unlock(&s->lock);
    return j;
}

static void *sched_main(void *arg) {
    srv_sched *s = arg;
    double t0 = squad_now_seconds();
    squad_engine *e = squad_engine_new(s->model, &s->opts, &s->engine_err);
    if (e && s->on_ready && s->on_ready(s->log_ctx, e, &s->engine_err) < 0) {
        squad_engine_free(e);
        e = NULL;
    }
    pthread_mutex_lock(&s->lock);
    s->engine = e;
    s->ready = e ? 1 : -1;
    s->stats.ready = s->ready == 1;
    if (e) snprintf(s->stats.device, sizeof s->stats.device, "%s", squad_engine_device(e));
    pthread_mutex_unlock(&s->lock);
    if (e) {
        publish_engine_stats(s);
        sched_log(s, "engine ready on %s in %.1f s; state cache budget %.1f MB", squad_engine_device(e),
                  squad_now_seconds() - t0, (double)s->stats.cache.budget_bytes / (1 << 20));
    } else {
        sched_log(s, "the engine could not be created: %s", s->engine_err.msg);
    }
    for (;;) {
        srv_job *job = sched_next_work(s);
        if (!job) break;
        if (s->stopping && squad_now_seconds() > s->stop_deadline) complete(s, job, SRV_JOB_SHUTDOWN);
        else run_job(s, job);
    }
    return NULL;
}

/* The sweeper: the scheduler thread cannot look at the queue while the engine runs a chunk (a long
 * chunk on a CPU takes seconds), so this thread does, every SRV_SWEEP_MS. */
static void *sweeper_main(void *arg) {
    srv_sched *s = arg;
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

srv_sched *srv_sched_start(squad_model *model, const squad_engine_opts *opts, int capacity,
                           void (*log)(void *ctx, const char *line), srv_sched_on_ready on_ready, void *log_ctx,
                           squad_err *err) {
    srv_sched *s = squad_calloc(1, sizeof *s, err);
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
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        srv_sched_stop(s, 0);
        squad_fail(err, SQUAD_E_NOMEM, "cannot start the scheduler thread");
        return NULL;
    }
    s->thread_started = 1;
    if (pthread_create(&s->sweeper, NULL, sweeper_main, s) != 0) {
        srv_sched_stop(s, 0);
        squad_fail(err, SQUAD_E_NOMEM, "cannot start the scheduler's sweeper thread");
        return NULL;
    }
    s->sweeper_started = 1;
    return s;
}

int srv_sched_submit(srv_sched *s, srv_job *job) {
    job->next = NULL;
    job->cancel_seen = 0;
    job->status = SRV_JOB_OK;
    job->rows_run = 0;
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

int srv_sched_ready(srv_sched *s, squad_err *err) {
    pthread_mutex_lock(&s->lock);
    int r = s->ready;
    if (r < 0 && err) *err = s->engine_err;
    pthread_mutex_unlock(&s->lock);
    return r;
}

void srv_sched_get_stats(srv_sched *s, srv_sched_stats *out) {
    pthread_mutex_lock(&s->lock);
    *out = s->stats;
    pthread_mutex_unlock(&s->lock);
}

void srv_sched_stop(srv_sched *s, double grace_s) {
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
