/*
 * cache.h — the cross-request state cache (docs/design.md section 7).
 *
 * A row is [state prefix | question suffix]. Checkpoints of the model state at chosen positions
 * of the prefix (p, p - tail, multiples of stride; aligned) are kept in backend memory, LRU within
 * a byte budget; a later row restores the deepest checkpoint whose tokens it shares and computes
 * only the rest. Lookup goes through an index of aligned token blocks (never a scan over all
 * cached states), and a candidate is always verified against the tokens.
 */
#ifndef SQUAD_CACHE_H
#define SQUAD_CACHE_H

#include "backend.h"
#include "specialists.h"
#include "squad.h"

typedef struct squad_cache squad_cache;
struct squad_engine;

squad_cache *squad_cache_new(squad_backend *be, const squad_cache_opts *opts, squad_err *err);
void squad_cache_free(squad_cache *cache);

/* 1 when the row may take the cached path (state_len given, p >= min_prefix, slots in the suffix,
 * at most max_slots slots, fits the backend); 0 otherwise. */
int squad_cache_eligible(const squad_cache *cache, const squad_row *row);

/* Routing of a cached row (specialists, DESIGN.md section 4), shared between the cache and the
 * span runner: the cache sets *run_route (the route the runner's chunks run with) and *feat (the
 * router features of [0, start) when a span starts from a restored checkpoint or a row start);
 * the runner grows *feat chunk by chunk. */
typedef struct squad_cache_routing {
    int forced;              /* -1: the router decides; else the route every pass runs with */
    int last_route;          /* the guess when no checkpoint gives one (the last row's route) */
    int *run_route;
    squad_router_feat *feat;
    /* The router's route on *feat (>= 0), or a negative error code with err filled. */
    int (*decide)(void *ctx, squad_err *err);
    void *ctx;
    int mispredicted; /* out: 1 when the guess was wrong and the row ran a second pass */
} squad_cache_routing;

/* Answers an eligible row: restore, run the rest through squad_engine_run_span, checkpoint, evict.
 * end_only: checkpoint the state at its end (p) only. Fills out->reused and out->cache_written.
 * When the span runner fails (an error, a cancelled row) the checkpoints the row had pending are
 * released, those it had committed stay (valid states), and the cache stays consistent.
 * rt (NULL without specialists) routes the row: a guessed route (the forced one; else the route of
 * the deepest checkpoint the row can restore, preferring rt->last_route at equal depth; else
 * rt->last_route) runs every layer; when the router then disagrees, the row's first-pass
 * checkpoints are dropped and the row runs again with the router's route from that route's deepest
 * checkpoint (a misprediction). Checkpoints carry the route their upper layers ran with and the
 * router features of their prefix; upper-layer state is restored only under its own route.
 * Sets out->route. */
int squad_cache_score(squad_cache *cache, struct squad_engine *e, const squad_row *row, int end_only,
                      squad_cache_routing *rt, squad_result *out, squad_err *err);

/* With specialists: every checkpoint also keeps the router features of its prefix (dim doubles);
 * called on an empty cache before its first row. */
int squad_cache_set_feat_dim(squad_cache *cache, int dim, squad_err *err);

/* Drops every checkpoint and group (the counters stay; a clear is not counted as evictions). */
void squad_cache_clear(squad_cache *cache);

void squad_cache_get_stats(const squad_cache *cache, squad_cache_stats *out);

#endif /* SQUAD_CACHE_H */
