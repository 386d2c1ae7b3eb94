/*
 * cache_dir.h — the server's disk tier (--cache-dir; docs/server.md): the state cache read back in
 * the background at start and written after the drain at shutdown.
 *
 * At start (once the engine exists) a reader thread checks and reads the directory's file
 * (squad_engine_cache_read: it touches only what the engine fixed at creation) while the server
 * already answers; /ready does not wait for it. The snapshot then goes to the scheduler thread as a
 * job of its own (SRV_JOB_CALL), which adopts it between steps. At shutdown, after the requests in
 * flight are drained, the scheduler thread saves the cache (the request queue's on_stop), unless
 * the load had not finished (the file would lose what was not yet adopted). Every refusal and each
 * step is a log line.
 */
#ifndef SQUAD_SERVER_CACHE_DIR_H
#define SQUAD_SERVER_CACHE_DIR_H

#include "squad.h"

struct squad_server;
struct srv_jobs;
typedef struct srv_cache_dir srv_cache_dir;

/* dir and tokenizer_path are copied. NULL when out of memory. */
srv_cache_dir *srv_cache_dir_new(struct squad_server *srv, const char *dir, const char *tokenizer_path, squad_err *err);
/* The request queue the adoption job goes to (set once it exists; the reader waits for it). */
void srv_cache_dir_attach(srv_cache_dir *cd, struct srv_jobs *jobs);
/* Starts the background read (on the scheduler thread, the engine just made). */
void srv_cache_dir_start(srv_cache_dir *cd, squad_engine *engine);
/* Stops and joins the reader (before the request queue stops: its adoption job may be waiting). */
void srv_cache_dir_stop_reader(srv_cache_dir *cd);
/* Saves the cache (the scheduler thread, the engine drained). */
void srv_cache_dir_save(srv_cache_dir *cd, squad_engine *engine);
void srv_cache_dir_free(srv_cache_dir *cd);

#endif /* SQUAD_SERVER_CACHE_DIR_H */
