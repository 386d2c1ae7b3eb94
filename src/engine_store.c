/*
 * engine_store.c — the engine's disk tier (squad.h: squad_engine_cache_save / _load / _read /
 * _adopt; docs/design.md section 7, "Tiers"): the identity and shapes that a cache file must match
 * come from the engine (its model, specialists, backend and cache options); cache_store.c writes,
 * checks and reads the file, and the cache adopts what it read.
 *
 * _read touches only what the engine fixed at its creation, so a server runs it on a thread of its
 * own while the engine answers, then hands the snapshot to _adopt on the engine's thread.
 */
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_store.h"
#include "engine.h"
#include "util.h"

/* What a file must match for this engine. */
static int engine_shape(const squad_engine *e, const char *tokenizer_path, squad_store_shape *s, squad_err *err) {
    memset(s, 0, sizeof *s);
    int rc = squad_store_identity(e->model, e->sp, tokenizer_path, e->be->name, (int)e->opts.precision, s->identity, err);
    if (rc) return rc;
    s->gdn_bytes = e->be->gdn_snapshot_bytes;
    s->kv_bytes_per_pos = e->be->kv_bytes_per_pos;
    s->align = e->opts.cache.align;
    s->feat_dim = squad_cache_feat_dim(e->cache);
    s->max_positions = e->be->max_context;
    s->vocab = squad_model_vocab_size(e->model);
    s->n_routes = e->sp ? squad_specialists_count(e->sp) : 1;
    return 0;
}

static int no_cache(squad_err *err) {
    return squad_fail(err, SQUAD_E_INVALID, "the state cache is off (--cache-mb 0): nothing to save or load");
}

int squad_engine_cache_save(squad_engine *e, const squad_cache_store_opts *o, squad_cache_store_stats *st,
                            squad_err *err) {
    squad_cache_store_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    if (!e->cache) return no_cache(err);
    if (!o || !o->dir) return squad_fail(err, SQUAD_E_INVALID, "cache save: no directory");
    squad_store_shape shape;
    int rc = engine_shape(e, o->tokenizer_path, &shape, err);
    if (!rc) rc = squad_store_save(e->cache, &shape, o->dir, st, err);
    e->disk_saved += st->checkpoints;
    return rc;
}

squad_cache_snapshot *squad_engine_cache_read(const squad_engine *e, const squad_cache_store_opts *o,
                                              squad_cache_store_stats *st, squad_err *err) {
    squad_cache_store_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    if (!e->cache) {
        no_cache(err);
        return NULL;
    }
    if (!o || !o->dir) {
        squad_fail(err, SQUAD_E_INVALID, "cache load: no directory");
        return NULL;
    }
    squad_store_shape shape;
    if (engine_shape(e, o->tokenizer_path, &shape, err)) return NULL;
    return squad_store_read(o->dir, &shape, o, st, err);
}

int squad_engine_cache_adopt(squad_engine *e, squad_cache_snapshot *snap, squad_cache_store_stats *st, squad_err *err) {
    if (!e->cache) return no_cache(err);
    if (!snap) return squad_fail(err, SQUAD_E_INVALID, "cache adopt: no snapshot");
    squad_cache_store_stats local = {0};
    if (!st) st = &local;
    const double t0 = squad_now_seconds();
    st->checkpoints = 0; /* from here: checkpoints adopted, not read */
    squad_store_adopt(e->cache, snap, st);
    st->seconds += squad_now_seconds() - t0;
    e->disk_loaded += st->checkpoints;
    e->disk_refused += st->refused;
    return 0;
}

int squad_engine_cache_load(squad_engine *e, const squad_cache_store_opts *o, squad_cache_store_stats *st,
                            squad_err *err) {
    squad_cache_store_stats local;
    if (!st) st = &local;
    squad_cache_snapshot *snap = squad_engine_cache_read(e, o, st, err);
    if (!snap) return err->code ? err->code : SQUAD_E_NOMEM;
    int rc = squad_engine_cache_adopt(e, snap, st, err);
    squad_cache_snapshot_free(snap);
    return rc;
}
