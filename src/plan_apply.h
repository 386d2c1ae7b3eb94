/*
 * plan_apply.h — applies the state cache's plans (cache.h) on a backend's sequence slot.
 *
 * The split follows "the cache plans, the caller applies": the cache (cache.c) looks a row up and
 * returns a plan (what to restore, where to checkpoint, which route), hands out blobs and joins
 * committed checkpoints; it never touches a sequence slot. This layer, one above the cache, moves
 * state between a slot and the plan's blobs: restore the planned checkpoint into the slot (or reset
 * it), save the slot's GDN part at a kept bound, save its K / V at the commit. The scheduler
 * (scheduler.c) applies these steps to every row in flight, each on its own slot, between batched
 * steps. The name says what the file does, applying a plan on a slot, rather than suggesting that
 * the cache executes anything: the cache is below this layer and knows nothing of it.
 *
 * squad_plan_run_row strings the steps together for one uncontested row on slot 0 with a span
 * runner (a fake backend's in tests), so the cache's policy can be checked without a model.
 */
#ifndef SQUAD_PLAN_APPLY_H
#define SQUAD_PLAN_APPLY_H

#include "backend.h"
#include "cache.h"
#include "specialists.h"
#include "squad.h"

/* The plan's checkpoint into slot seq (load_gdn, then load_kv up to c0), or a reset when it
 * starts cold; feat (NULL without specialists) gets the checkpoint's router features, or zero. */
int squad_plan_restore(squad_backend *be, int seq, const squad_cache_plan *plan, squad_router_feat *feat,
                       squad_err *err);
/* Slot seq holds [0, plan->bounds[i]): when bounds[i] is kept, its GDN part is saved into a blob
 * the cache hands out (pending; none when memory is short: not kept). Fails only when the save
 * does (the blob is dropped). */
int squad_plan_save_bound(squad_cache *cache, squad_backend *be, int seq, squad_cache_plan *plan, int i,
                          const squad_router_feat *feat, squad_err *err);
/* The plan's pending checkpoints join the cache, with slot seq's K / V of [0, p) when they need a
 * new group (the slot must still hold [0, p): nothing past p written, or only positions from p on). */
int squad_plan_commit(squad_cache *cache, squad_backend *be, int seq, const squad_row *row, squad_cache_plan *plan,
                      squad_err *err);

/* Runs row->ids[start, end) from the backend's working state (which holds [0, start)); answers
 * the row's slots inside the span into out and adds end - start to out->computed. */
typedef int (*squad_span_fn)(void *ctx, const squad_row *row, int start, int end, squad_result *out,
                             squad_err *err);

/* Answers an eligible row through the cache on slot 0 of the cache's backend, on the trunk's route:
 * plan, restore, run the prefix through `run` bound by bound (saving the kept checkpoints), commit,
 * run the question, close. Fills out->reused and out->cache_written. When the span runner fails
 * the plan is abandoned: the checkpoints still pending are released, those committed stay (valid
 * states), its pins are released and the cache stays consistent. For tests and benchmarks: the
 * engine's rows go through the scheduler. */
int squad_plan_run_row(squad_cache *cache, squad_span_fn run, void *ctx, const squad_row *row, squad_result *out,
                       squad_err *err);

#endif /* SQUAD_PLAN_APPLY_H */
