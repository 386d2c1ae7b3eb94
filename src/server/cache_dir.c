/*
 * cache_dir.c — the server's disk tier (interface and design in cache_dir.h).
 */
#include "server/cache_dir.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/request.h"

/* How long the reader waits before offering its snapshot again to a full request queue. */
#define SRV_CACHE_DIR_RETRY_US 10000

struct srv_cache_dir {
    squad_server *srv;
    char *dir, *tokenizer_path;
    squad_engine *engine; /* what the reader reads the identity of */
    _Atomic(srv_jobs *) jobs; /* where the adoption job goes */
    pthread_t reader;
    int reader_started;
    _Atomic int stop;       /* the reader gives up */
    _Atomic int load_over;  /* the adoption ran, or never will: a save may replace the file */
    squad_cache_snapshot *snap;
    squad_cache_store_stats st;
    srv_job job;
};

static void cd_log(void *ctx, const char *line) { srv_log(((srv_cache_dir *)ctx)->srv, "cache dir: %s", line); }

static int cd_stopping(void *ctx) {
    srv_cache_dir *cd = ctx;
    return atomic_load(&cd->stop) || atomic_load(&cd->srv->stopping);
}

static squad_cache_store_opts cd_opts(srv_cache_dir *cd) {
    squad_cache_store_opts o;
    memset(&o, 0, sizeof o);
    o.dir = cd->dir;
    o.tokenizer_path = cd->tokenizer_path;
    o.log = cd_log;
    o.log_ctx = cd;
    o.stop = cd_stopping;
    o.stop_ctx = cd;
    return o;
}

/* On the scheduler thread: the snapshot into the cache. */
static void cd_adopt(void *ctx, squad_engine *engine) {
    srv_cache_dir *cd = ctx;
    squad_err err = {0};
    const uint64_t read = cd->st.checkpoints;
    const double read_s = cd->st.seconds;
    if (squad_engine_cache_adopt(engine, cd->snap, &cd->st, &err) == 0)
        srv_log(cd->srv, "cache dir: %llu checkpoints loaded from %s (%llu read, %llu refused, %llu not taken: no room or "
                "held already; %.1f MB read in %.2f s, adopted in %.3f s)",
                (unsigned long long)cd->st.checkpoints, cd->dir, (unsigned long long)read,
                (unsigned long long)cd->st.refused, (unsigned long long)cd->st.skipped, (double)cd->st.bytes / 1e6,
                read_s, cd->st.seconds - read_s);
    else
        srv_log(cd->srv, "cache dir: %s", err.msg);
}

/* The job's end, however it ended (adopted, or answered by a shutdown first). */
static void cd_job_done(srv_job *job) {
    srv_cache_dir *cd = job->owner;
    squad_cache_snapshot_free(cd->snap);
    cd->snap = NULL;
    atomic_store(&cd->load_over, 1);
}

static void *cd_reader(void *arg) {
    srv_cache_dir *cd = arg;
    squad_cache_store_opts o = cd_opts(cd);
    squad_err err = {0};
    cd->snap = squad_engine_cache_read(cd->engine, &o, &cd->st, &err);
    if (!cd->snap) {
        srv_log(cd->srv, "cache dir: %s: nothing loaded: %s", cd->dir, err.msg);
        atomic_store(&cd->load_over, 1);
        return NULL;
    }
    memset(&cd->job, 0, sizeof cd->job);
    cd->job.kind = SRV_JOB_CALL;
    cd->job.engine_call = cd_adopt;
    cd->job.call_ctx = cd;
    cd->job.done = cd_job_done;
    cd->job.owner = cd;
    srv_jobs *jobs;
    while (!(jobs = atomic_load(&cd->jobs)) || srv_jobs_submit(jobs, &cd->job) < 0) { /* again shortly */
        if (cd_stopping(cd)) {
            squad_cache_snapshot_free(cd->snap);
            cd->snap = NULL;
            atomic_store(&cd->load_over, 1);
            return NULL;
        }
        usleep(SRV_CACHE_DIR_RETRY_US);
    }
    return NULL;
}

srv_cache_dir *srv_cache_dir_new(squad_server *srv, const char *dir, const char *tokenizer_path, squad_err *err) {
    srv_cache_dir *cd = squad_calloc(1, sizeof *cd, err);
    if (!cd) return NULL;
    cd->srv = srv;
    cd->dir = squad_strdup(dir, err);
    cd->tokenizer_path = tokenizer_path ? squad_strdup(tokenizer_path, err) : NULL;
    if (!cd->dir || (tokenizer_path && !cd->tokenizer_path)) {
        srv_cache_dir_free(cd);
        return NULL;
    }
    return cd;
}

void srv_cache_dir_attach(srv_cache_dir *cd, srv_jobs *jobs) { atomic_store(&cd->jobs, jobs); }

void srv_cache_dir_start(srv_cache_dir *cd, squad_engine *engine) {
    cd->engine = engine;
    if (pthread_create(&cd->reader, NULL, cd_reader, cd) == 0) {
        cd->reader_started = 1;
        srv_log(cd->srv, "cache dir: reading %s in the background", cd->dir);
    } else {
        srv_log(cd->srv, "cache dir: cannot start the reader thread: nothing loaded");
        atomic_store(&cd->load_over, 1);
    }
}

void srv_cache_dir_stop_reader(srv_cache_dir *cd) {
    if (!cd || !cd->reader_started) return;
    atomic_store(&cd->stop, 1);
    pthread_join(cd->reader, NULL);
    cd->reader_started = 0;
}

void srv_cache_dir_save(srv_cache_dir *cd, squad_engine *engine) {
    if (!atomic_load(&cd->load_over)) {
        srv_log(cd->srv, "cache dir: not saved: the load of %s had not finished (the file is kept as it was)", cd->dir);
        return;
    }
    squad_cache_store_opts o = cd_opts(cd);
    o.stop = NULL;
    squad_cache_store_stats st;
    squad_err err = {0};
    if (squad_engine_cache_save(engine, &o, &st, &err) == 0)
        srv_log(cd->srv, "cache dir: %llu checkpoints (%llu groups, %.1f MB) saved to %s in %.2f s",
                (unsigned long long)st.checkpoints, (unsigned long long)st.groups, (double)st.bytes / 1e6, cd->dir,
                st.seconds);
    else
        srv_log(cd->srv, "cache dir: not saved: %s", err.msg);
}

void srv_cache_dir_free(srv_cache_dir *cd) {
    if (!cd) return;
    srv_cache_dir_stop_reader(cd);
    squad_cache_snapshot_free(cd->snap);
    free(cd->dir);
    free(cd->tokenizer_path);
    free(cd);
}
