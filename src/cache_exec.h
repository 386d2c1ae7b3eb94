/*
 * cache_exec.h — runs a cached row: the engine's side of the state cache's plans (cache.h).
 *
 * The cache decides (what to restore, where to checkpoint, which route to guess); this layer
 * executes its plans on a backend: restore the planned checkpoint (or reset), run the prefix's
 * spans through a span runner, save the GDN blobs at the planned positions and the new group's
 * K / V, run the question, and, with specialists, confirm the guessed route or plan a second pass.
 * The steps that touch a sequence slot are exported for the engine's scheduler (scheduler.c),
 * which runs every row in flight through them between batched steps; squad_cache_exec strings
 * them together for one row on slot 0 with a span runner (a stand-in in tests), so the cache's
 * policy can be checked with a fake backend and no model.
 */
#ifndef SQUAD_CACHE_EXEC_H
#define SQUAD_CACHE_EXEC_H

#include "backend.h"
#include "cache.h"
#include "specialists.h"
#include "squad.h"

/* The plan's checkpoint into slot seq (load_gdn, then load_kv up to c0), or a reset when it
 * starts cold; feat (NULL without specialists) gets the checkpoint's router features, or zero. */
int squad_cache_restore(squad_backend *be, int seq, const squad_cache_plan *plan, squad_router_feat *feat,
                        squad_err *err);
/* Slot seq holds [0, plan->bounds[i]): when bounds[i] is kept, its GDN part is saved into a blob
 * the cache hands out (pending; none when memory is short: not kept). Fails only when the save
 * does (the blob is dropped). */
int squad_cache_save_bound(squad_cache *cache, squad_backend *be, int seq, squad_cache_plan *plan, int i,
                           const squad_router_feat *feat, squad_err *err);
/* The plan's pending checkpoints join the cache, with slot seq's K / V of [0, p) when they need a
 * new group (the slot must still hold [0, p): nothing past p written, or only positions from p on). */
int squad_cache_commit(squad_cache *cache, squad_backend *be, int seq, const squad_row *row, squad_cache_plan *plan,
                       squad_err *err);

/* Runs row->ids[start, end) from the backend's working state (which holds [0, start)); answers
 * the row's slots inside the span into out and adds end - start to out->computed. */
typedef int (*squad_span_fn)(void *ctx, const squad_row *row, int start, int end, squad_result *out,
                             squad_err *err);

/* Routing of a cached row (specialists, docs/specialists.md), shared between the executor and the
 * span runner: the executor sets *run_route (the route the runner's chunks run with) and *feat (the
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

/* Answers an eligible row through the cache: plan, restore, run the rest through `run`,
 * checkpoint, commit, close. end_only: checkpoint the state at its end (p) only. Fills
 * out->reused, out->cache_written and out->route. When the span runner fails (an error, a
 * cancelled row) the plan is abandoned: the checkpoints the row had pending are released, those it
 * had committed stay (valid states), its pins are released and the cache stays consistent.
 * rt (NULL without specialists) routes the row: a guessed route (the forced one; else the route of
 * the deepest checkpoint the row can restore, preferring rt->last_route at equal depth; else
 * rt->last_route) runs every layer and keeps its checkpoints pending; when the router then
 * disagrees, the pending checkpoints are dropped and the row runs again with the router's route
 * from that route's deepest checkpoint (a misprediction). Checkpoints carry the route their upper
 * layers ran with and the router features of their prefix; upper-layer state is restored only
 * under its own route. marks (n_marks, may be NULL) are more checkpoint positions the caller asks
 * for (squad_cache_plan_open_at). */
int squad_cache_exec(squad_cache *cache, squad_backend *be, squad_span_fn run, void *ctx, const squad_row *row,
                     int end_only, const int *marks, int n_marks, squad_cache_routing *rt, squad_result *out,
                     squad_err *err);

/* squad_cache_exec without routing, for tests and benchmarks: the cache's own backend. */
int squad_cache_score_with(squad_cache *cache, squad_span_fn run, void *ctx, const squad_row *row,
                           squad_result *out, squad_err *err);

/* squad_cache_score_with for one call's options: end_only keeps only the checkpoint at p (the
 * state's end), without the tail, stride and fork checkpoints. */
int squad_cache_score_ex(squad_cache *cache, squad_span_fn run, void *ctx, const squad_row *row, int end_only,
                         squad_result *out, squad_err *err);

#endif /* SQUAD_CACHE_EXEC_H */
